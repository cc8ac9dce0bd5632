"""`rljax train | ablate | eval` argument handling: every config field from the command line.

Nothing here trains: `train_config` / `ablate_configs` / `eval_config` stop after
validation, `--check` after loading the files a config names, and the trainer and the
ablation runner are replaced by recorders where `main` would call them.
"""

import collections
import json
import os
import pathlib
import subprocess
import sys

import pytest

from rljax import cli
from rljax.cli import commands
from rljax.train.ablate import runner
from rljax.train.config import load_config, loading, parse_override_value
from rljax.train.run import loop

REPO = pathlib.Path(__file__).parent.parent


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
  monkeypatch.chdir(REPO)


def test_list_fields_take_python_or_json_lists_and_comma_lists():
  # The README's commands that ml_collections' config_flags refused ("Type <class 'list'>
  # ... is not supported for overriding").
  config = cli.train_config([
      "--config", "experiments/grpo.py",
      "--config.task.reward_fns=[\"examples/reverse_task.py:brevity\", \"pkg.mod:fn\"]",
      "--config.task.reward_weights=[0.5, 1]",
      "--config.model.lora_targets=q,v", "--config.model.lora_rank=8"])
  assert list(config.task.reward_fns) == ["examples/reverse_task.py:brevity", "pkg.mod:fn"]
  assert list(config.task.reward_weights) == [0.5, 1]
  assert list(config.model.lora_targets) == ["q", "v"]
  assert config.model.lora_rank == 8
  json_list = cli.train_config(["--config", "experiments/grpo.py",
                                "--config.model.lora_targets=[\"q\", \"o\"]"])
  assert list(json_list.model.lora_targets) == ["q", "o"]
  multiturn = cli.train_config(["--config", "experiments/grpo.py", "--config.task.env=m:make",
                                 "--config.sampling.turn_stop=[\"</call>\", \"</answer>\"]"])
  assert list(multiturn.sampling.turn_stop) == ["</call>", "</answer>"]
  empty = cli.train_config(["--config", "experiments/calculator.py",
                            "--config.sampling.max_turns=1", "--config.sampling.turn_stop="])
  assert list(empty.sampling.turn_stop) == []


def test_every_spelling_of_config_flags_and_nested_groups():
  config = cli.train_config([
      "--config=experiments/dapo.py:clip_higher", "--config.algo.eps_high", "0.3",
      "--config.algo.on_truncated_episode.env_error=drop", "--config.run.progress=false",
      "--config.optim.actor_lr=3e-4", "--config.algo.dual_clip=3", "--config.task.hf_config=main",
      "--config.algo.rsft_min_score=0.5"])
  assert config.algo.eps_high == 0.3 and config.algo.eps_low == 0.2   # the file's own step
  assert config.algo.on_truncated_episode.env_error == "drop"
  assert config.algo.on_truncated_episode.env_timeout == "mask"       # siblings untouched
  assert config.run.progress is False
  assert config.optim.actor_lr == 3e-4
  assert config.algo.dual_clip == 3.0 and isinstance(config.algo.dual_clip, float)
  assert config.task.hf_config == "main"
  assert config.algo.rsft_min_score == 0.5


@pytest.mark.parametrize("flag, words", [
    ("--config.run.iterations=2.5", ["run.iterations", "an int"]),
    ("--config.algo.eps_high=high", ["algo.eps_high", "a number"]),
    ("--config.run.progress=maybe", ["run.progress", "a bool"]),
    ("--config.model.lora_targets=[\"q\", 3]", ["model.lora_targets[1]", "text"]),
    ("--config.task.reward_fns={\"a\": 1}", ["task.reward_fns", "a list"]),
    ("--config.algo.on_truncated_episode=drop", ["algo.on_truncated_episode is a group",
                                                  "env_error"]),
    ("--config.algo.eps_hihg=0.3", ["unknown config field 'algo.eps_hihg'",
                                     "did you mean algo.eps_high"]),
    ("--config.algo.loss_agg=token_sum", ["algo.loss_agg='token_sum' is not one of"]),
])
def test_bad_values_exit_with_the_field_and_the_expected_type(flag, words, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["train", "--config", "experiments/grpo.py", flag, "--check"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("rljax train: ")
  for word in words:
    assert word in err


def test_usage_errors():
  with pytest.raises(cli.UsageError, match="--config experiments/NAME.py"):
    cli.parse_train_args(["--config.run.seed=1"])
  with pytest.raises(cli.UsageError, match="given twice"):
    cli.parse_train_args(["--config", "x.py", "--config.run.seed=1", "--config.run.seed=2"])
  with pytest.raises(cli.UsageError, match="unexpected argument"):
    cli.parse_train_args(["--config", "x.py", "--run.seed=1"])
  args = cli.parse_train_args(["--check", "--config", "x.py:a", "--config.run.seed", "3"])
  assert (args.spec, args.overrides, args.check) == ("x.py:a", {"run.seed": "3"}, True)


def test_parse_field_value_by_default_type():
  assert cli.parse_field_value("f", "TRUE", False) is True
  assert cli.parse_field_value("f", "0", True) is False
  assert cli.parse_field_value("f", "7", 1) == 7
  assert cli.parse_field_value("f", "1e-3", 0.5) == 1e-3
  assert cli.parse_field_value("f", "inf", 0.5) == float("inf")
  assert cli.parse_field_value("f", " a b ", "") == " a b "        # text is taken as written
  assert cli.parse_field_value("f", "0.1,2", []) == [0.1, 2]
  assert cli.parse_field_value("f", "a.py:f, b:g", []) == ["a.py:f", "b:g"]
  assert cli.parse_field_value("f", "none", None) is None
  with pytest.raises(ValueError, match="f='True': expected an int"):
    cli.parse_field_value("f", "True", 1)                           # a bool is not an int


@pytest.mark.parametrize("text, seeds", [("0,1,2", [0, 1, 2]), ("0-5", [0, 1, 2, 3, 4, 5]),
                                         ("0-2,7", [0, 1, 2, 7]), (" 4 ", [4]), ("", None)])
def test_parse_seeds(text, seeds):
  assert cli.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["a", "3-1", "0,0", "1-x"])
def test_parse_seeds_rejects(text):
  with pytest.raises(cli.UsageError, match="--seeds"):
    cli.parse_seeds(text)


def test_ablate_validates_every_step_and_seed_with_the_same_values():
  plan = cli.ablate_configs(["experiments/dapo.py", "--seeds", "0-1", "--out", "/tmp/ab",
                             "--set", "task.reward_fns=[\"m.py:f\", \"n:g\"]", "--set", "run.iterations=5"])
  assert [(s, seed) for s, seed, _ in plan][:2] == [("naive_grpo", 0), ("overlong_filtering", 0)]
  assert len(plan) == 12 and {seed for _, seed, _ in plan} == {0, 1}
  for step, seed, config in plan:
    assert config.run.dir == f"/tmp/ab/{step}/seed{seed}" and config.run.seed == seed
    assert list(config.task.reward_fns) == ["m.py:f", "n:g"] and config.run.iterations == 5
  clip_higher = next(c for s, _, c in plan if s == "clip_higher")
  assert clip_higher.algo.eps_high == 0.28
  with pytest.raises(cli.UsageError, match="run.iterations"):
    cli.ablate_configs(["experiments/dapo.py", "--set", "run.iterations=many"])
  with pytest.raises(cli.UsageError, match="no ABLATION_STEPS"):
    cli.ablate_configs(["experiments/grpo.py"])


def test_ablate_hands_the_runner_values_it_reads_back_exactly(monkeypatch, capsys):
  seen = {}

  def fake_run_ablation(experiment, *, out_dir, overrides, seeds, steps, aa, report_only, module,
                        runs):
    seen.update(experiment=experiment, out_dir=out_dir, seeds=seeds, steps=steps,
                values={k: parse_override_value(v) for k, v in
                        (item.split("=", 1) for item in overrides)})
    return "report.md"

  monkeypatch.setattr(commands, "run_ablation", fake_run_ablation)
  cli.main(["ablate", "experiments/dapo.py", "--seeds", "0-2",
            "--set", "task.reward_fns=[\"examples/reverse_task.py:brevity\"]",
            "--set", "task.hf_config=1e5", "--set", "algo.dynamic_sampling=yes",
            "--set", "optim.actor_lr=1", "--set", "algo.rsft_min_score=None"])
  assert seen["seeds"] == [0, 1, 2] and seen["experiment"] == "experiments/dapo.py"
  # the runner's own parser (parse_override_value) gets back each field's typed value
  assert seen["values"] == {"task.reward_fns": ["examples/reverse_task.py:brevity"],
                            "task.hf_config": "1e5", "algo.dynamic_sampling": True,
                            "optim.actor_lr": 1.0, "algo.rsft_min_score": None}
  assert isinstance(seen["values"]["optim.actor_lr"], float)
  assert capsys.readouterr().out.strip() == "report: report.md"


def test_train_runs_the_validated_config(monkeypatch, capsys):
  seen = []
  monkeypatch.setattr(commands, "train_validated",
                      lambda config: seen.append(config) or {"acc": 1.0})
  cli.main(["train", "--config", "experiments/grpo.py", "--config.run.iterations=3",
            "--config.task.reward_fns=[\"examples/reverse_task.py:brevity\"]"])
  assert seen[0].run.iterations == 3
  assert list(seen[0].task.reward_fns) == ["examples/reverse_task.py:brevity"]
  assert capsys.readouterr().out.strip() == 'RESULT {"acc": 1.0}'


class _Stop(Exception):
  """Raised where the command would start training."""


def _counted(monkeypatch, counts, module, name, key):
  fn = getattr(module, name)

  def wrapped(*args, **kwargs):
    counts[key] += 1
    return fn(*args, **kwargs)
  monkeypatch.setattr(module, name, wrapped)


def _stop(*args, **kwargs):
  raise _Stop


def test_train_parses_once_validates_once_and_ablate_imports_once(monkeypatch, tmp_path):
  """`rljax train` reads its command line once and validates the config once (by
  `load_config`, not again in the loop); `rljax ablate` imports the experiment file once
  for the step check, every step's config and the runner."""
  counts = collections.Counter()
  _counted(monkeypatch, counts, commands, "parse_train_args", "parse")
  for module in (loading, loop):
    _counted(monkeypatch, counts, module, "validate", "validate")
  monkeypatch.setattr(loop, "_Session", _stop)
  with pytest.raises(_Stop):
    cli.main(["train", "--config", "experiments/grpo.py", "--config.run.iterations=3"])
  assert counts == {"parse": 1, "validate": 1}
  for module in (commands, loading, runner):
    _counted(monkeypatch, counts, module, "import_experiment", "import")
  monkeypatch.setattr(runner, "enable_persistent_cache", _stop)
  with pytest.raises(_Stop):
    cli.main(["ablate", "experiments/dapo.py", "--seeds", "0-1", "--out", str(tmp_path)])
  assert counts["import"] == 1
  assert counts["validate"] == 1 + 12   # 6 steps x 2 seeds, once each


def test_check_loads_named_files_and_reports_missing_ones(tmp_path, capsys):
  cli.main(["train", "--config", "experiments/user_task.py", "--check"])
  out = capsys.readouterr().out
  assert "task 'python': 2000 train and 128 held-out prompts" in out
  assert "task.reward_fns: brevity (weight 0.2)" in out
  with pytest.raises(SystemExit):
    cli.main(["train", "--config", "experiments/grpo.py", "--check",
              "--config.task.reward_fns=[\"examples/reverse_task.py:nope\"]"])
  assert "has no attribute 'nope'" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(["train", "--config", "experiments/grpo.py", "--check",
              f"--config.model.hf_path={tmp_path / 'absent'}", "--config.task.chat_template=1"])
  assert "model.hf_path=" in capsys.readouterr().err


def test_eval_check_reads_a_saved_config(tmp_path, capsys):
  saved = load_config("experiments/grpo.py").to_dict()
  saved["algo"].pop("ref_refresh")        # a run saved before a field existed still reads
  saved["sampling"]["n"] = 4
  (tmp_path / "config.json").write_text(json.dumps(saved))
  config = cli.eval_config(["--run", str(tmp_path)])
  assert config.sampling.n == 4 and config.algo.ref_refresh == "none"
  cli.main(["eval", "--run", str(tmp_path), "--check"])
  assert "config.json is valid" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    cli.main(["eval", "--run", str(tmp_path / "nothing")])
  assert "holds no config.json" in capsys.readouterr().err


def test_python_dash_m_rljax_in_a_subprocess():
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  done = subprocess.run(
      [sys.executable, "-m", "rljax", "train", "--config", "experiments/calculator.py",
       "--config.sampling.turn_stop=[\"</call>\"]", "--config.sampling.max_turns=4", "--check"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert "task.env: rljax.envs.calculator:calculator_env" in done.stdout
  bad = subprocess.run([sys.executable, "-m", "rljax", "train", "--config",
                        "experiments/grpo.py", "--config.sampling.n=two"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "sampling.n='two': expected an int" in bad.stderr
