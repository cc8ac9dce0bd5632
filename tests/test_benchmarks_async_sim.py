"""benchmarks/async_sim.py in-process on tiny settings: the cost model on hand-computed
lengths, and properties of the event simulation (synchronous = sum of phases, monotone in
k, bounded staleness, where the devices should go)."""

import dataclasses
import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "async_sim.py"
_spec = importlib.util.spec_from_file_location("async_sim", _PATH)
sim = importlib.util.module_from_spec(_spec)
sys.modules["async_sim"] = sim   # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(sim)

N = 8
KS = (0, 1, 2, 4)
SPLITS = sim.all_splits(N)


def _workload(seed=0, iterations=12, batch=16, **kw):
  rng = np.random.default_rng(seed)
  return sim.Workload(sim.draw_lengths(rng, iterations, batch, median=30, sigma=0.9,
                                       budget=128, **kw))


def _costs(**kw):
  return dataclasses.replace(sim.Costs(budget=128), **kw)


# ------------------------------------------------------------------ the cost model

UNIT = dict(decode_fixed_ms=1.0, decode_row_ms=1.0, prefill_row_ms=0.0)   # a = b = 1 ms
LENGTHS = np.array([1, 2, 4, 8])


@pytest.mark.parametrize("batching, slots, lengths, want_ms", [
    ("static", 0, LENGTHS, 8 * (1 + 4)),              # 8 steps, 4 rows charged throughout
    ("continuous", 0, LENGTHS, 8 + (1 + 2 + 4 + 8)),  # 8 steps + one row-step per token
    # halving: rows charged per step 4, 4 (3 active), 2, 2, 1, 1, 1, 1 -> 16
    ("halving", 0, LENGTHS, 8 + 16),
    # 5 rows: step 2 has 3 active > 5 // 2, so all 5 stay charged.
    ("halving", 0, [1, 1, 2, 2, 2], 2 + (5 + 5)),
    # 64 rows, one of length 10: steps 2-10 charge the last level, 64 // 16 = 4 slots.
    ("halving", 0, [1] * 63 + [10], 10 + (64 + 9 * 4)),
    # 2 slots refilled in order: slot A 1 then 4 (ends at 5), slot B 2 then 8 (ends at 10)
    ("continuous", 2, LENGTHS, 10 + 15),
    ("halving", 2, LENGTHS, 10 + 15),   # with a queue, rljax's sampler refills slots too
    ("static", 2, LENGTHS, 2 * (1 + 2) + 8 * (1 + 2)),  # waves [1, 2] and [4, 8]
])
def test_decode_cost_hand_computed(batching, slots, lengths, want_ms):
  costs = _costs(batching=batching, slots=slots, **UNIT)
  assert sim.device_decode_s(np.asarray(lengths), costs) == pytest.approx(want_ms / 1e3)


def test_device_scaling_and_update_cost():
  dp = _costs(batching="continuous", **UNIT)
  # Two devices, contiguous blocks [1, 2] (2 + 3 ms) and [4, 8] (8 + 12 ms): the slower.
  assert sim.generation_s(LENGTHS, 2, dp) == pytest.approx(20e-3)
  linear = dataclasses.replace(dp, sampler_scaling="linear")
  assert sim.generation_s(LENGTHS, 2, linear) == pytest.approx(23e-3 / 2)
  padded = _costs(update_token_ms=1.0, update_row_ms=10.0, prompt_len=2, budget=8)
  assert sim.update_s(LENGTHS, 2, padded, prox=False) == pytest.approx((4 * 10 + 40) / 2e3)
  packed = dataclasses.replace(padded, update_layout="packed", prox_token_ms=1.0)
  assert sim.update_s(LENGTHS, 1, packed, prox=True) == pytest.approx((2 * 23 + 40) / 1e3)


# ------------------------------------------------------------------ the simulation


def test_synchronous_colocated_is_the_sum_of_phase_times():
  workload, costs = _workload(), _costs(colocated_sync_s=0.01)
  r = sim.run_config(workload, costs, split="colocated", k=0, n_devices=N)
  gen, upd = sim.phase_times(workload, costs, sampler_devices=N, trainer_devices=N, k=0)
  assert r.total_s == pytest.approx(np.sum(gen + upd + 0.01), rel=1e-12)
  np.testing.assert_allclose(r.update_end_s, np.cumsum(gen + upd + 0.01), rtol=1e-12)
  assert r.trainer_idle == pytest.approx(np.sum(gen) / r.total_s)
  np.testing.assert_array_equal(r.lag, 0)
  # Alternating on shared devices is work-conserving: any k costs the same sum.
  for k in KS[1:]:
    r = sim.run_config(workload, costs, split="colocated", k=k, n_devices=N)
    assert r.total_s == pytest.approx(np.sum(gen + upd + 0.01), rel=1e-12)


@pytest.mark.parametrize("batching", sim.BATCHING)
@pytest.mark.parametrize("seed", [0, 1])
def test_throughput_non_decreasing_in_k_on_disjoint_devices(batching, seed):
  workload, costs = _workload(seed), _costs(batching=batching)
  for split in SPLITS[1:]:
    rates = [sim.run_config(workload, costs, split=split, k=k, n_devices=N).samples_per_s
             for k in KS]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(rates, rates[1:], strict=False)), (split, rates)
  # ... and strictly better than synchronous for a balanced split.
  r0, r1 = (sim.run_config(workload, costs, split="4+4", k=k, n_devices=N) for k in (0, 1))
  assert r1.samples_per_s > 1.2 * r0.samples_per_s


def test_staleness_of_consumed_batches_is_bounded_by_k():
  workload = _workload(iterations=20)
  results = sim.sweep(workload, _costs(), splits=SPLITS, ks=KS, n_devices=N)
  for (split, k), r in results.items():
    assert 0 <= r.lag.min() and r.lag.max() <= k, (split, k, r.lag)
  # The bound binds when the sampler is much faster than the trainer: it runs k ahead.
  fast_sampler = _costs(update_token_ms=5.0)
  for k in KS:
    r = sim.run_config(workload, fast_sampler, split="6+2", k=k, n_devices=N)
    assert r.lag.max() == k and r.lag[-1] == k
  # Shared cores keep the bound too.
  shared = sim.sweep(workload, _costs(), splits=["colocated"], ks=KS, n_devices=N,
                     shared_cores=True, contention=0.7)
  assert all(r.lag.max() <= k for (_, k), r in shared.items())


@pytest.mark.parametrize("scaling", sim.SAMPLER_SCALING)
def test_zero_update_time_gives_every_device_to_the_sampler(scaling):
  costs = _costs(update_token_ms=0.0, update_row_ms=0.0, sync_s=0.0,
                 sampler_scaling=scaling)
  results = sim.sweep(_workload(), costs, splits=SPLITS, ks=KS, n_devices=N)
  best = max(results, key=lambda key: results[key].samples_per_s)
  assert best[0] == "colocated"   # all N devices generate
  if scaling == "linear":
    disjoint = {key: r for key, r in results.items() if key[0] != "colocated"}
    assert max(disjoint, key=lambda key: disjoint[key].samples_per_s)[0] == f"{N - 1}+1"


def test_linear_scaling_never_favours_a_disjoint_split():
  # max(G/n_s, U/n_t) >= (G + U)/N: under linear scaling no split beats colocated k = 0.
  for seed, token_ms in ((0, 0.121), (1, 0.01), (2, 0.002)):
    costs = _costs(sampler_scaling="linear", update_token_ms=token_ms, sync_s=0.0)
    results = sim.sweep(_workload(seed), costs, splits=SPLITS, ks=KS, n_devices=N)
    sync = results[("colocated", 0)].samples_per_s
    assert max(r.samples_per_s for r in results.values()) <= sync * (1 + 1e-9)


def test_shared_cores_between_time_slicing_and_independent_devices():
  gen = np.array([0.3, 0.5, 0.2, 0.4, 0.6])
  upd = np.array([0.4, 0.1, 0.5, 0.3, 0.2])
  run = lambda **kw: sim.simulate(gen, upd, k=1, sync_s=0.0, batch=1, **kw)  # noqa: E731
  sync = sim.simulate(gen, upd, k=0, sync_s=0.0, batch=1, mode="colocated")
  assert sync.total_s == pytest.approx(np.sum(gen + upd))
  # Pure time-slicing: the same work at the same total rate, no gain.
  assert run(mode="shared", contention=0.5).total_s == pytest.approx(sync.total_s)
  # No interference: exactly two independent devices.
  assert run(mode="shared", contention=1.0).total_s == pytest.approx(
      run(mode="disjoint").total_s)
  partial = run(mode="shared", contention=0.75).total_s
  assert run(mode="disjoint").total_s < partial < sync.total_s


# ------------------------------------------------------------------ the command line


def test_main_prints_a_result_line_last(capsys):
  result = sim.main(["--iterations", "10", "--prompts", "2", "--n", "4",
                     "--splits", "colocated,2+6,4+4,6+2"])
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1].startswith("RESULT ")
  printed = json.loads(out[-1][len("RESULT "):])
  assert printed == result and printed["metric"] == "async_throughput_gain"
  assert printed["ratio"] == pytest.approx(printed["rljax"] / printed["peer"], rel=1e-2)
  assert printed["ratio"] >= 1.0   # colocated k >= 1 reproduces the synchronous schedule
  assert sum(line.startswith("| ") for line in out) == 1 + 4 * 4   # header + 4 splits x 4 k


def test_phases_file_replays_measured_times(tmp_path):
  path = tmp_path / "phases.json"
  path.write_text(json.dumps({"generate_s": [0.8, 1.6], "update_s": 2.4, "devices": 2,
                              "colocated_sync_s": 0.05, "lengths": [[10, 20], [30, 40]]}))
  costs, workload = sim.load_phases(path, sim.Costs(), rng=np.random.default_rng(0),
                                    n_batches=4, batch=2, median=30, sigma=0.5)
  assert costs.colocated_sync_s == 0.05 and workload.lengths.shape == (4, 2)
  r = sim.run_config(workload, costs, split="colocated", k=0, n_devices=4)
  # Measured on 2 devices, replayed on 4: each phase takes half its measured time.
  assert r.total_s == pytest.approx((0.4 + 0.8 + 0.4 + 0.8) + 4 * 1.2 + 4 * 0.05)
  path.write_text(json.dumps({"update_seconds": 1.0}))
  with pytest.raises(ValueError, match="unknown keys"):
    sim.load_phases(path, sim.Costs(), rng=np.random.default_rng(0), n_batches=2, batch=2,
                    median=30, sigma=0.5)


def test_measured_run_prediction_and_fitted_contention(tmp_path, capsys):
  rng = np.random.default_rng(3)
  lengths = rng.uniform(20, 60, 12)
  gen = 0.2 + 0.01 * lengths
  upd = 0.5 + 0.004 * lengths
  rows = [{"iteration": i + 1, "time/rollout_s": g, "time/update_s": u,
           "train/response_length_mean": n} for i, (g, u, n) in enumerate(zip(gen, upd, lengths))]
  sync_run = tmp_path / "sync.jsonl"
  sync_run.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  # A "measured" k = 1 run whose iterations match contention 0.7 exactly.
  target = sim.simulate(gen, upd, k=1, sync_s=0.0, mode="shared", batch=1, contention=0.7)
  async_run = tmp_path / "async.jsonl"
  async_run.write_text("\n".join(json.dumps({"time/iteration_s": target.iteration_s})
                                 for _ in rows) + "\n")
  result = sim.main(["--measured", str(sync_run), "--compare", str(async_run), "--skip", "0",
                     "--contention", "0.5", "--prompts", "1", "--n", "1"])
  out = capsys.readouterr().out
  assert "fit sampler seconds ≈ 0.2000 + 0.01000" in out   # recovers the generating line
  assert result["sync_iteration_s"] == pytest.approx(np.mean(gen + upd), rel=1e-3)
  assert result["k1_shared_iteration_s"] == pytest.approx(result["sync_iteration_s"], rel=1e-3)
  assert result["fitted_contention"] == pytest.approx(0.7, abs=1e-3)
