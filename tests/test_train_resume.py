"""Runs that survive: SIGKILL mid-run then resume == uninterrupted; corrupt checkpoint fallback."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_micro import MICRO, micro_config, restored_state

from rljax.train.loop import train

REPO = pathlib.Path(__file__).parent.parent


def _cli_flags(overrides):
  return [f"--config.{k}={v}" for k, v in overrides.items()]


def _records(run_dir):
  out = []
  for line in (run_dir / "metrics.jsonl").read_text().splitlines():
    r = json.loads(line)
    # Wall-clock times and the process-wide compile counter depend on the process, not the run.
    out.append({k: v for k, v in r.items()
                if not k.startswith("time/") and k != "compile/programs"})
  return out


def _final_params(run_dir, step):
  with ocp.PyTreeCheckpointer() as ckpt:
    tree = ckpt.restore(run_dir / "checkpoints" / str(step) / "state")
  return jax.tree.map(np.asarray, tree)


def _wait_for_checkpoint(run_dir, step, proc, timeout=240):
  target = run_dir / "checkpoints" / str(step)
  deadline = time.time() + timeout
  while time.time() < deadline:
    if target.is_dir() and not any(p.name.startswith("tmp") for p in target.parent.iterdir()
                                   if p.name != str(step)):
      return
    if proc.poll() is not None:
      raise AssertionError(f"training process exited early ({proc.returncode})")
    time.sleep(0.2)
  raise AssertionError("no checkpoint appeared")


# A MoE policy sampled in bf16 with routing replay: the routes of the batch in flight are
# written beside the checkpoint and replayed after the resume.
MOE_REPLAY = {"model.num_experts": 4, "model.num_experts_per_tok": 2,
              "model.moe_intermediate_size": 32, "algo.routing_replay": "sampler",
              "sampling.sampler_dtype": "bfloat16"}


@pytest.mark.slow
@pytest.mark.parametrize("staleness,partial,extra", [
    (0, False, {}), (1, False, {}), (2, True, {}), (1, False, MOE_REPLAY)],
    ids=["synchronous", "batches_in_flight", "partial_rollout_in_flight",
         "moe_routes_in_flight"])
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path, staleness, partial, extra):
  """Killed after checkpoint 2 and resumed: the same records and parameters as a run that
  was never interrupted; with sampling.max_staleness = 1 the batch sampled ahead of the
  checkpoint is written beside it and consumed after the resume; with k = 2 and partial
  rollouts so is the batch whose first segments (by versions the checkpoint no longer
  holds) were sampled, and it resumes from its next segment; with a MoE policy and routing
  replay, so are that batch's recorded experts."""
  overrides = dict(MICRO, **{"run.iterations": 5, "run.save_every": 1,
                             "task.prompt_sampler": "prioritized", "algo.reward_norm": True,
                             "sampling.max_staleness": staleness,
                             "sampling.partial_rollouts": partial,
                             "task.reward_fns": ["tests/signal_rewards.py:digit_share"]},
                   **extra)
  reference = micro_config("grpo", tmp_path / "ref", **overrides)
  train(reference)

  run_dir = tmp_path / "killed" / "grpo"
  flags = _cli_flags(dict(overrides, **{"run.dir": str(run_dir)}))
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.Popen([sys.executable, "-m", "rljax", "train", "--config",
                           "experiments/grpo.py", *flags], cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    _wait_for_checkpoint(run_dir, 2, proc)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert not (run_dir / "result.json").exists()   # it really died mid-run

  resumed = micro_config("grpo", tmp_path / "killed", **overrides)
  result = train(resumed)
  assert result["iterations"] == 5
  if staleness:
    saved = sorted((run_dir / "inflight").glob("*.npz"))
    assert saved
    with np.load(saved[0]) as data:   # the older version the next batch starts with, too
      assert ("partial/meta" in data.files) == partial
      assert any(k.startswith("model") for k in data.files) == partial
      assert ("0/routes" in data.files) == bool(extra)   # uint8 [B, P + T, L_moe, k]
      assert not extra or data["0/routes"].dtype == np.uint8
  assert _records(run_dir) == _records(tmp_path / "ref" / "grpo")
  a, b = _final_params(run_dir, 5), _final_params(tmp_path / "ref" / "grpo", 5)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, capsys):
  overrides = dict(MICRO, **{"run.iterations": 2, "run.save_every": 1})
  config = micro_config("grpo", tmp_path, **overrides)
  train(config)
  ckpt_dir = tmp_path / "grpo" / "checkpoints"
  assert sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir()) == ["1", "2"]
  for f in (ckpt_dir / "2" / "state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  capsys.readouterr()
  config = micro_config("grpo", tmp_path, **dict(overrides, **{"run.iterations": 3}))
  result = train(config)
  out = capsys.readouterr().out
  assert "checkpoint 2 unreadable" in out and "resumed from checkpoint 1" in out
  assert result["iterations"] == 3
  iterations = [json.loads(line)["iteration"]
                for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
  assert iterations == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpoint_of_a_per_layer_run_resumes_scanned(tmp_path, capsys, lora):
  """A run checkpointed with one module per layer (as before `model.scan_layers`) resumes
  with scanned layers: parameters, optimizer moments (and a LoRA run's frozen base) stacked
  on restore, equal to what was saved; the run then trains on."""
  from rljax.models.stack import per_layer_layout

  overrides = dict(MICRO, **{"run.iterations": 1, "run.save_every": 1, "model.num_layers": 2,
                             "model.scan_layers": False,
                             **({"model.lora_rank": 2} if lora else {})})
  train(micro_config("grpo", tmp_path, **overrides))
  run_dir = tmp_path / "grpo"
  saved = _final_params(run_dir, 1)
  assert "1" in saved["actor"]["layers"]   # written per layer
  scanned = micro_config("grpo", tmp_path, **dict(overrides, **{"model.scan_layers": True}))
  state = restored_state(run_dir, scanned)
  assert sorted(state.actor["layers"]) == [0] and "layer" in state.actor["layers"][0]
  for part in ("actor", "actor_opt"):
    back, want = _by_path(per_layer_layout(getattr(state, part))), _by_path(saved[part])
    assert sorted(back) == sorted(want)
    for path, value in want.items():
      np.testing.assert_array_equal(back[path], value, err_msg=str(path))
  if lora:   # the base (written once, per layer) stacked too
    assert state.base["layers"][0]["layer"]["attn"]["q"][...].shape[0] == 2
  capsys.readouterr()
  result = train(micro_config("grpo", tmp_path, **dict(overrides, **{
      "model.scan_layers": True, "run.iterations": 2})))
  assert "resumed from checkpoint 1" in capsys.readouterr().out
  assert result["iterations"] == 2


def _by_path(tree):
  """{leaf path with every key as a string: host array} (orbax reads integer keys back as
  strings)."""
  def key(entry):
    return str(next(getattr(entry, f) for f in ("key", "name", "idx") if hasattr(entry, f)))
  return {tuple(map(key, path)): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
