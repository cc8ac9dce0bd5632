"""Asynchronous RL throughput: a discrete-event simulation against staleness and device split.

An RL run is a sampler that generates batches and a trainer that consumes one batch per
update. Synchronous rljax (k = 0, colocated) alternates: generate, update, generate, ...
Asynchronous rollouts let the sampler run up to k weight versions ahead of the trainer
(`sampling.max_staleness` = k), optionally on a disjoint device set. This script predicts
samples per second for every staleness bound and split from per-phase costs, in pure
NumPy (seconds to run). It measures nothing itself.

The model
- Sampler: starts batch j as soon as it is free and the newest published weights have
  version ≥ j − k, and generates all of batch j with that version (a batch is drained
  before the next starts; AReaL-style interruptible generation that switches weights
  mid-rollout, arXiv:2505.24298, is not modelled). The lag of batch j is (trainer version
  when it is consumed) − (version that generated it) = j − version ≤ k.
- Generation cost of B rows with completion lengths ℓ_i on one device: prefill p per row
  plus decode steps costing a + b·(rows charged at that step):
    static      all rows charged until the longest ends (waves of `--slots` rows if set);
    halving     rljax's continuous sampler with every request resident
                (`rljax.sampling.continuous`): n rows until at most n//2 are active, then
                compacted onto n//2, n//4, n//8, n//16 slots in turn (charged = the slots);
    continuous  ideal continuous batching: only active rows are charged.
  With `--slots` below the rows on a device, static runs in waves of that many rows;
  halving and continuous refill the slots from a queue as rows finish (the final drain
  charged per active row).
- Devices: `--sampler-scaling data_parallel` (default) splits the batch into contiguous
  row blocks, one per sampler device; each device pays its own fixed cost a per step and
  the batch waits for the slowest device. `linear` divides the one-device time by the
  device count (the simple model: throughput proportional to devices). Under `linear`
  the split cannot beat colocated: max(G/n_s, U/n_t) ≥ (G + U)/N; any gain of a disjoint
  split comes from the fixed per-step decode cost and stragglers that data parallelism
  does not divide, and from overlapping the weight sync.
- Trainer: one update per batch costing (u_tok·tokens + u_row·B)/n_t seconds, linear in
  its devices (gradient all-reduce not modelled); tokens = B·(P + budget) for the padded
  layout (rljax's default) or Σ_i (P + ℓ_i) packed. `--prox-token-ms` adds the forward
  pass for the proximal log-probs of the decoupled loss (`rljax.ops.off_policy`) at k ≥ 1
  (0 when, with one update per batch, π_prox = sg(π_θ) comes from the update's forward).
  After each update the weights are published: `--sync-s` on disjoint devices,
  `--colocated-sync-s` when colocated (rljax: nothing to copy, 0).
- Colocated: sampler and trainer share all N devices and alternate (one phase at a
  time, the trainer first when both are ready). `--shared-cores`: they run concurrently
  on the same compute and each progresses at `--contention` × its solo speed while both
  are busy (0.5 = pure time-slicing, no gain; 1 = no interference): the 2-core CPU case.

Defaults are this machine's figures from benchmarks/README.md (quiet machine, the
shared 3.41 M-parameter workload): decode 0.34 ms + 0.059 ms per row per step (15,500
tok/s at 64 rows, 9,900 at 8), prefill 0.5 ms per 32-token row, update 0.121 ms per
token (0.99 s for 64 × (32 + 96) tokens), weight copy to another simulated CPU device
0.025 s (13.6 MB, median of 7 `device_put`s); lengths lognormal (median 40, σ 0.8)
capped at 256, batch 8 prompts × 8 samples, 8 devices.

    python benchmarks/async_sim.py                        # k ∈ {0,1,2,4} × every split
    python benchmarks/async_sim.py --phases phases.json   # costs / lengths / times from a file
    python benchmarks/async_sim.py --measured runs/x/metrics.jsonl [--compare runs/y/...]
    python benchmarks/async_sim.py --reduced   # CI's run: 10 iterations of 2 x 4 samples

`--phases` JSON (its values win over the flags): any cost flag by its dest name
("decode_fixed_ms", "update_token_ms", "sync_s", "budget", ...); "lengths": a flat list
(the empirical distribution) or one list per batch; "generate_s" / "update_s": measured
seconds per batch (lists, replayed in turn, or numbers) on "devices" devices (default 1),
which replace the cost model (scaled linearly to other device counts).

`--measured` reads `time/rollout_s` (else `time/generate_s` + `time/score_s`),
`time/update_s` and `train/response_length_mean` per iteration of an rljax metrics file
(a synchronous run on one colocated device), fits both phase times linearly in the mean
length, and replays the measured phases to predict the synchronous and k = 1 iteration
time on that one device, alternating and with `--shared-cores`. `--compare` takes a
measured k = 1 run (`--iteration-key` per iteration, default "time/iteration_s", else
rollout + update) and reports the contention that would explain it.

Last line: RESULT {"metric": "async_throughput_gain", "rljax": <best async samples/s>,
"peer": <synchronous colocated samples/s>, "ratio": ..., "best": "<split> k=<k>"}
(`--measured`: metric "async_predicted_gain_measured", the k = 1 shared-cores prediction
over the synchronous one).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math

import numpy as np

BATCHING = ("static", "halving", "continuous")
SAMPLER_SCALING = ("data_parallel", "linear")
UPDATE_LAYOUTS = ("padded", "packed")
STALENESS = (0, 1, 2, 4)
# slot halvings of the "halving" batching, down to one slot (rljax's continuous sampler
# stops at rljax.sampling.slot_loop.MIN_DRAIN_SLOTS slots: this charges it a little less)
DRAIN_LEVELS = 4


@dataclasses.dataclass(frozen=True)
class Costs:
  """Per-phase costs (one device) and the sampler/trainer layout choices."""

  decode_fixed_ms: float = 0.34    # a: per decode step and device
  decode_row_ms: float = 0.059     # b: per charged row and step
  prefill_row_ms: float = 0.5      # p: per row
  update_token_ms: float = 0.121   # u_tok: per (prompt + completion) token in the update
  update_row_ms: float = 0.0       # u_row: per row
  prox_token_ms: float = 0.0       # proximal log-prob forward per token, at k >= 1
  sync_s: float = 0.025            # weight publish after each update, disjoint devices
  colocated_sync_s: float = 0.0    # the same when colocated
  prompt_len: int = 32
  budget: int = 256                # completion budget (the padded width)
  batching: str = "halving"
  slots: int = 0                   # decode slots per device (0: every row resident)
  sampler_scaling: str = "data_parallel"
  update_layout: str = "padded"

  def __post_init__(self):
    for name, valid in (("batching", BATCHING), ("sampler_scaling", SAMPLER_SCALING),
                        ("update_layout", UPDATE_LAYOUTS)):
      if getattr(self, name) not in valid:
        raise ValueError(f"{name} must be one of {valid}, got {getattr(self, name)!r}")


# ------------------------------------------------------------------ phase costs


def draw_lengths(rng, n_batches, batch, *, median, sigma, budget, empirical=None):
  """Completion lengths, int [n_batches, batch] in [1, budget]: lognormal or resampled."""
  if empirical is not None:
    pool = np.asarray(empirical, np.int64).ravel()
    lengths = rng.choice(pool, size=(n_batches, batch), replace=True)
  else:
    lengths = np.rint(rng.lognormal(math.log(median), sigma, size=(n_batches, batch)))
  return np.clip(lengths, 1, budget).astype(np.int64)


def _charged_rows_per_step(lengths, batching):
  """Rows charged at decode steps 1..max(ℓ) when every row is resident."""
  n, top = len(lengths), int(lengths.max())
  active = n - np.searchsorted(np.sort(lengths), np.arange(1, top + 1), side="left")
  if batching == "static":
    return np.full(top, n)
  if batching == "continuous":
    return active
  levels = [n]   # halving: n, then n//2, n//4, ... (at most DRAIN_LEVELS halvings)
  while len(levels) <= DRAIN_LEVELS and levels[-1] // 2 >= 1:
    levels.append(levels[-1] // 2)
  levels = np.array(levels[::-1])
  return levels[np.searchsorted(levels, active, side="left")]   # the smallest that holds them


def _makespan_steps(lengths, slots):
  """Decode steps to finish rows in order on `slots` slots, each refilled when one ends."""
  ends = [0] * slots
  for length in lengths:
    heapq.heappush(ends, heapq.heappop(ends) + int(length))
  return max(ends)


def device_decode_s(lengths, costs):
  """Seconds for one device to prefill and decode rows with these lengths."""
  lengths = np.asarray(lengths, np.int64)
  if lengths.size == 0:
    return 0.0
  a, b, p = (x / 1e3 for x in (costs.decode_fixed_ms, costs.decode_row_ms, costs.prefill_row_ms))
  prefill = p * lengths.size
  slots = costs.slots if 0 < costs.slots < lengths.size else 0
  if costs.batching != "static" and slots:   # a queue refills the slots (drain charged per row)
    return prefill + a * _makespan_steps(lengths, slots) + b * lengths.sum()
  if slots:   # static, in waves of `slots` rows
    return prefill + sum(device_decode_s(w, dataclasses.replace(costs, slots=0, prefill_row_ms=0))
                         for w in np.array_split(lengths, -(-lengths.size // slots)))
  charged = _charged_rows_per_step(lengths, costs.batching)
  return prefill + a * charged.size + b * charged.sum()


def generation_s(lengths, devices, costs):
  """Wall seconds to generate one batch (lengths [B]) on `devices` sampler devices."""
  if costs.sampler_scaling == "linear":
    return device_decode_s(lengths, costs) / devices
  return max(device_decode_s(block, costs) for block in np.array_split(lengths, devices))


def update_s(lengths, devices, costs, *, prox):
  """Wall seconds of one update (plus the proximal forward if `prox`) on `devices`."""
  lengths = np.asarray(lengths)
  if costs.update_layout == "padded":
    tokens = lengths.size * (costs.prompt_len + costs.budget)
  else:
    tokens = float(np.sum(costs.prompt_len + lengths))
  per_token = costs.update_token_ms + (costs.prox_token_ms if prox else 0.0)
  return (per_token * tokens + costs.update_row_ms * lengths.size) / 1e3 / devices


# ------------------------------------------------------------------ the event simulation


@dataclasses.dataclass
class SimResult:
  total_s: float
  samples_per_s: float
  iteration_s: float
  trainer_idle: float      # fraction of the run the trainer was neither updating nor syncing
  sampler_idle: float      # fraction of the run the sampler was not generating
  lag: np.ndarray          # int [n]: staleness of each consumed batch
  update_end_s: np.ndarray  # float [n]: when each update (and its sync) finished


MODES = ("disjoint", "colocated", "shared")


def simulate(gen_s, upd_s, *, k, sync_s, mode, batch, contention=0.5):
  """Runs len(upd_s) updates; gen_s[j] / upd_s[i] are solo wall seconds of each phase.

  mode: "disjoint" (own devices each), "colocated" (one phase at a time on shared
  devices, the trainer first), "shared" (concurrent on shared compute, each at
  `contention` × solo speed while both are busy).
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  if k < 0:
    raise ValueError(f"staleness bound k must be >= 0, got {k}")
  n = len(upd_s)
  t, published, gen_next, upd_next = 0.0, 0, 0, 0
  ready = 0                       # batches generated so far
  version = np.zeros(n, np.int64)
  lag = np.zeros(n, np.int64)
  update_end = np.zeros(n)
  sampler = trainer = None        # [index, remaining solo seconds] / [index, remaining, phase]
  busy_sampler = busy_trainer = 0.0
  while upd_next < n:
    if trainer is None and upd_next < ready and not (mode == "colocated" and sampler):
      trainer = [upd_next, float(upd_s[upd_next]), "update"]
      lag[upd_next] = upd_next - version[upd_next]
    if (sampler is None and gen_next < n and published >= gen_next - k
        and not (mode == "colocated" and trainer)):
      sampler = [gen_next, float(gen_s[gen_next])]
      version[gen_next] = published
    running = [job for job in (sampler, trainer) if job is not None]
    if not running:
      raise RuntimeError("simulation deadlock")   # unreachable for k >= 0
    speed = contention if (mode == "shared" and len(running) == 2) else 1.0
    dt = min(job[1] for job in running) / speed
    t += dt
    for job in running:
      job[1] -= dt * speed
    busy_sampler += dt if sampler is not None else 0.0
    busy_trainer += dt if trainer is not None else 0.0
    if sampler is not None and sampler[1] <= 1e-12:
      ready, gen_next, sampler = ready + 1, gen_next + 1, None
    if trainer is not None and trainer[1] <= 1e-12 and trainer[2] == "update":
      trainer = [trainer[0], float(sync_s), "sync"]
    if trainer is not None and trainer[1] <= 1e-12 and trainer[2] == "sync":
      update_end[trainer[0]] = t
      published, upd_next, trainer = trainer[0] + 1, upd_next + 1, None
  return SimResult(total_s=t, samples_per_s=n * batch / t, iteration_s=t / n,
                   trainer_idle=1.0 - busy_trainer / t, sampler_idle=1.0 - busy_sampler / t,
                   lag=lag, update_end_s=update_end)


# ------------------------------------------------------------------ configurations


def parse_split(split, n_devices):
  """"colocated" -> None; "s+t" -> (s, t) with s + t <= n_devices."""
  if split == "colocated":
    return None
  s, t = (int(x) for x in split.split("+"))
  if s < 1 or t < 1 or s + t > n_devices:
    raise ValueError(f"split {split!r}: need s, t >= 1 and s + t <= {n_devices}")
  return s, t


def all_splits(n_devices):
  return ["colocated"] + [f"{s}+{n_devices - s}" for s in range(1, n_devices)]


@dataclasses.dataclass
class Workload:
  """Per-batch inputs: completion lengths [n, B] and, optionally, measured phase times."""

  lengths: np.ndarray
  generate_s: np.ndarray | None = None   # measured seconds per batch on `measured_devices`
  update_s: np.ndarray | None = None
  measured_devices: int = 1


def phase_times(workload, costs, *, sampler_devices, trainer_devices, k):
  """Solo wall seconds (gen [n], update [n]) of each batch on the given device counts."""
  lengths = workload.lengths
  if workload.generate_s is not None:
    gen = workload.generate_s * workload.measured_devices / sampler_devices
  else:
    gen = np.array([generation_s(row, sampler_devices, costs) for row in lengths])
  if workload.update_s is not None:
    upd = workload.update_s * workload.measured_devices / trainer_devices
    if k > 0 and costs.prox_token_ms:
      upd = upd + np.array([update_s(row, trainer_devices, dataclasses.replace(
          costs, update_token_ms=0.0, update_row_ms=0.0), prox=True) for row in lengths])
  else:
    upd = np.array([update_s(row, trainer_devices, costs, prox=k > 0) for row in lengths])
  return gen, upd


def run_config(workload, costs, *, split, k, n_devices, shared_cores=False, contention=0.5):
  """Simulates one (split, k) configuration of the workload."""
  layout = parse_split(split, n_devices)
  sampler_devices, trainer_devices = (n_devices, n_devices) if layout is None else layout
  gen, upd = phase_times(workload, costs, sampler_devices=sampler_devices,
                         trainer_devices=trainer_devices, k=k)
  if layout is None:
    mode, sync = ("shared" if shared_cores else "colocated"), costs.colocated_sync_s
  else:
    mode, sync = "disjoint", costs.sync_s
  return simulate(gen, upd, k=k, sync_s=sync, mode=mode, batch=workload.lengths.shape[1],
                  contention=contention)


def sweep(workload, costs, *, splits, ks, n_devices, shared_cores=False, contention=0.5):
  """{(split, k): SimResult} for every combination."""
  return {(s, k): run_config(workload, costs, split=s, k=k, n_devices=n_devices,
                             shared_cores=shared_cores, contention=contention)
          for s in splits for k in ks}


def best_async(results):
  """(split, k) with the most samples/s among k >= 1."""
  return max((key for key in results if key[1] >= 1), key=lambda key: results[key].samples_per_s)


def format_table(results):
  lines = ["| split (sampler+trainer) | k | samples/s | s / iteration | trainer idle | "
           "sampler idle | lag mean | lag max |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for (split, k), r in results.items():
    lines.append(f"| {split} | {k} | {r.samples_per_s:.1f} | {r.iteration_s:.3f} | "
                 f"{r.trainer_idle:.0%} | {r.sampler_idle:.0%} | {r.lag.mean():.2f} | "
                 f"{r.lag.max()} |")
  return "\n".join(lines)


# ------------------------------------------------------------------ inputs from files


COST_FIELDS = {f.name for f in dataclasses.fields(Costs)}


def load_phases(path, costs, *, rng, n_batches, batch, median, sigma):
  """(Costs, Workload) from a phases JSON file (see the module docstring)."""
  with open(path) as f:
    spec = json.load(f)
  unknown = set(spec) - COST_FIELDS - {"lengths", "generate_s", "update_s", "devices"}
  if unknown:
    raise ValueError(f"{path}: unknown keys {sorted(unknown)}; valid: cost fields "
                     f"{sorted(COST_FIELDS)} and lengths, generate_s, update_s, devices")
  costs = dataclasses.replace(costs, **{k: v for k, v in spec.items() if k in COST_FIELDS})
  lengths = spec.get("lengths")
  if lengths and isinstance(lengths[0], list):   # one list per batch, replayed in turn
    per_batch = [np.asarray(row, np.int64) for row in lengths]
    batch = len(per_batch[0])
    lengths = np.stack([per_batch[j % len(per_batch)] for j in range(n_batches)])
  else:
    lengths = draw_lengths(rng, n_batches, batch, median=median, sigma=sigma,
                           budget=costs.budget, empirical=lengths)

  def replay(key):
    if key not in spec:
      return None
    values = np.atleast_1d(np.asarray(spec[key], np.float64))
    return values[np.arange(n_batches) % values.size]

  return costs, Workload(lengths=lengths, generate_s=replay("generate_s"),
                         update_s=replay("update_s"), measured_devices=int(spec.get("devices", 1)))


def read_metrics(path, *, skip):
  """Per-iteration (sampler seconds, update seconds, mean length) arrays of a metrics file."""
  gen, upd, length, rows = [], [], [], []
  with open(path) as f:
    for line in f:
      if line.strip():
        rows.append(json.loads(line))
  for r in rows[skip:]:
    if "time/update_s" not in r or not ("time/rollout_s" in r or "time/generate_s" in r):
      continue
    gen.append(r.get("time/rollout_s", r.get("time/generate_s", 0.0) + r.get("time/score_s", 0.0)))
    upd.append(r["time/update_s"])
    length.append(r.get("train/response_length_mean", float("nan")))
  if not gen:
    raise ValueError(f"{path}: no iteration with time/update_s and time/generate_s after "
                     f"skipping {skip}")
  return np.asarray(gen), np.asarray(upd), np.asarray(length)


def linear_fit(x, y):
  """(intercept, slope, R²) of the least-squares line y ≈ c + s·x (slope 0 if x is constant)."""
  if np.ptp(x) == 0 or not np.all(np.isfinite(x)):
    return float(np.mean(y)), 0.0, 0.0
  slope, intercept = np.polyfit(x, y, 1)
  resid = y - (intercept + slope * x)
  total = np.sum((y - y.mean()) ** 2)
  return float(intercept), float(slope), float(1 - resid @ resid / total) if total else 1.0


def predict_measured(gen, upd, *, contention, sync_s=0.0, batch=1):
  """Mean predicted iteration seconds on one colocated device: synchronous, k = 1
  alternating, k = 1 on shared cores."""
  run = lambda k, mode: simulate(gen, upd, k=k, sync_s=sync_s, mode=mode, batch=batch,  # noqa: E731
                                 contention=contention)
  return {"sync": run(0, "colocated"), "k1_alternating": run(1, "colocated"),
          "k1_shared": run(1, "shared")}


def fit_contention(gen, upd, measured_iteration_s):
  """The contention c in [0.5, 1] whose k = 1 shared-cores prediction matches a measured
  mean iteration time (clipped to the ends; the prediction is monotone in c)."""
  def iteration(c):
    return simulate(gen, upd, k=1, sync_s=0.0, mode="shared", batch=1, contention=c).iteration_s
  lo, hi = 0.5, 1.0
  if measured_iteration_s >= iteration(lo):
    return lo
  if measured_iteration_s <= iteration(hi):
    return hi
  for _ in range(40):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if iteration(mid) > measured_iteration_s else (lo, mid)
  return (lo + hi) / 2


def read_iteration_times(path, key, *, skip):
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()][skip:]
  if rows and all(key in r for r in rows):
    return np.asarray([r[key] for r in rows])
  return np.asarray([r["time/rollout_s"] + r["time/update_s"] for r in rows
                     if "time/rollout_s" in r and "time/update_s" in r])


# ------------------------------------------------------------------ command line


def _args(argv=None):
  d = Costs()
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=8, help="N devices")
  ap.add_argument("--splits", default="all",
                  help='comma list of "colocated" and "s+t" (sampler+trainer devices); '
                       '"all": colocated and every s + t = N')
  ap.add_argument("--staleness", default=",".join(map(str, STALENESS)), help="k values")
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--n", type=int, default=8, help="samples per prompt")
  ap.add_argument("--iterations", type=int, default=100)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--length-median", type=float, default=40.0)
  ap.add_argument("--length-sigma", type=float, default=0.8)
  ap.add_argument("--lengths-file", help="JSON list of completion lengths to resample")
  ap.add_argument("--shared-cores", action="store_true",
                  help="colocated phases run concurrently on shared compute (see --contention)")
  ap.add_argument("--contention", type=float, default=0.5,
                  help="speed of each phase while both share the compute (0.5: time-slicing)")
  for f in dataclasses.fields(Costs):
    flag = "--" + f.name.replace("_", "-")
    ap.add_argument(flag, type=type(getattr(d, f.name)), default=getattr(d, f.name))
  ap.add_argument("--phases", help="JSON file of costs / lengths / measured phase times")
  ap.add_argument("--measured", help="rljax metrics.jsonl of a synchronous 1-device run")
  ap.add_argument("--compare", help="rljax metrics.jsonl of a measured k = 1 run")
  ap.add_argument("--iteration-key", default="time/iteration_s")
  ap.add_argument("--skip", type=int, default=1, help="first iterations to drop (compiles)")
  ap.add_argument("--reduced", action="store_true",
                  help="--iterations 10 --prompts 2 --n 4 (CI's run)")
  args = ap.parse_args(argv)
  if args.reduced:
    args.iterations, args.prompts, args.n = 10, 2, 4
  return args


def main_measured(args):
  gen, upd, length = read_metrics(args.measured, skip=args.skip)
  batch = args.prompts * args.n
  print(f"{args.measured}: {gen.size} iterations (first {args.skip} skipped); sampler side "
        f"{gen.mean():.3f} s, update {upd.mean():.3f} s, mean length {np.nanmean(length):.1f}")
  for name, y in (("sampler seconds", gen), ("update seconds", upd)):
    c, s, r2 = linear_fit(length, y)
    print(f"  fit {name} ≈ {c:.4f} + {s:.5f} · mean length   (R² {r2:.2f})")
  pred = predict_measured(gen, upd, contention=args.contention, batch=batch)
  print(f"predicted iteration seconds on 1 colocated device (contention {args.contention}):")
  for name, r in pred.items():
    print(f"  {name:>15}: {r.iteration_s:.3f} s  (trainer idle {r.trainer_idle:.0%}, "
          f"sampler idle {r.sampler_idle:.0%}, lag max {r.lag.max()})")
  result = {"metric": "async_predicted_gain_measured",
            "rljax": round(pred["k1_shared"].samples_per_s, 2),
            "peer": round(pred["sync"].samples_per_s, 2),
            "ratio": round(pred["k1_shared"].samples_per_s / pred["sync"].samples_per_s, 3),
            "sync_iteration_s": round(pred["sync"].iteration_s, 4),
            "k1_shared_iteration_s": round(pred["k1_shared"].iteration_s, 4),
            "contention": args.contention}
  if args.compare:
    measured = read_iteration_times(args.compare, args.iteration_key, skip=args.skip)
    c = fit_contention(gen, upd, float(measured.mean()))
    print(f"{args.compare}: measured k = 1 iteration {measured.mean():.3f} s over "
          f"{measured.size} iterations vs predicted {pred['k1_shared'].iteration_s:.3f} s "
          f"(contention {args.contention}); the contention that explains it: {c:.2f}")
    result.update(measured_k1_iteration_s=round(float(measured.mean()), 4),
                  fitted_contention=round(c, 3))
  print("RESULT " + json.dumps(result))
  return result


def main(argv=None):
  args = _args(argv)
  if args.measured:
    return main_measured(args)
  costs = Costs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Costs)})
  rng = np.random.default_rng(args.seed)
  batch = args.prompts * args.n
  if args.phases:
    costs, workload = load_phases(args.phases, costs, rng=rng, n_batches=args.iterations,
                                  batch=batch, median=args.length_median, sigma=args.length_sigma)
  else:
    empirical = None
    if args.lengths_file:
      with open(args.lengths_file) as f:
        empirical = json.load(f)
    workload = Workload(draw_lengths(rng, args.iterations, batch, median=args.length_median,
                                     sigma=args.length_sigma, budget=costs.budget,
                                     empirical=empirical))
  splits = all_splits(args.devices) if args.splits == "all" else args.splits.split(",")
  ks = [int(k) for k in args.staleness.split(",")]
  lengths = workload.lengths
  gen1, upd1 = phase_times(workload, costs, sampler_devices=1, trainer_devices=1, k=0)
  spread = lengths.max() / lengths.mean()
  print(f"{args.iterations} iterations of {lengths.shape[1]} samples; lengths mean "
        f"{lengths.mean():.1f}, max {lengths.max()} (max/mean {spread:.1f})")
  print(f"one-device phase seconds per batch: generate {gen1.mean():.3f} ({costs.batching}), "
        f"update {upd1.mean():.3f} ({costs.update_layout}); sync {costs.sync_s} s disjoint, "
        f"{costs.colocated_sync_s} s colocated; sampler scaling {costs.sampler_scaling}"
        + (f"; shared cores, contention {args.contention}" if args.shared_cores else ""))
  results = sweep(workload, costs, splits=splits, ks=ks, n_devices=args.devices,
                  shared_cores=args.shared_cores, contention=args.contention)
  print(format_table(results))
  sync = results.get(("colocated", 0)) or run_config(
      workload, costs, split="colocated", k=0, n_devices=args.devices)
  best = best_async(results) if any(k >= 1 for k in ks) else ("colocated", 0)
  r = results.get(best, sync)
  gain = r.samples_per_s / sync.samples_per_s
  print(f"best asynchronous: {best[0]} k={best[1]}: {r.samples_per_s:.1f} samples/s vs "
        f"synchronous colocated {sync.samples_per_s:.1f} ({gain:.2f}x)")
  result = {"metric": "async_throughput_gain", "rljax": round(r.samples_per_s, 2),
            "peer": round(sync.samples_per_s, 2),
            "ratio": round(gain, 3),
            "best": f"{best[0]} k={best[1]}", "iterations": args.iterations,
            "batch": batch, "devices": args.devices, "staleness": ks}
  print("RESULT " + json.dumps(result))
  return result


if __name__ == "__main__":
  main()
