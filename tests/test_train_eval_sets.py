"""Named evaluation sets (`eval.sets`): set in an experiment file, typed on the command
line, validated by field, evaluated before, during and after RL and logged by name."""

import json
import textwrap

import pytest
from ml_collections import ConfigDict
from train_micro import MICRO, read_records

from rljax.cli.overrides import UsageError, typed_overrides
from rljax.train.config import ConfigError, base_config, eval_set, load_config, validate
from rljax.train.loop import train

EXPERIMENT = textwrap.dedent('''
    from ml_collections import ConfigDict
    from rljax.train.config import base_config, eval_set

    def get_config(arg=None):
      c = base_config()
      c.eval.sets.hard = eval_set("arithmetic:5", size=4, k=2)
      # a partial entry: the fields it leaves out take eval_set()'s defaults
      c.eval.sets.cold = ConfigDict(dict(source="heldout", size=4, greedy=False,
                                         temperature=0.5, k=2))
      c.eval.sets.quick = eval_set("arithmetic:2", size=3, k=0)   # greedy only
      return c
''')


def test_two_named_sets_are_logged_by_name(tmp_path):
  path = tmp_path / "sets.py"
  path.write_text(EXPERIMENT)
  config = load_config(str(path), dict(MICRO, **{
      "run.dir": str(tmp_path / "run"), "run.iterations": 1, "run.eval_every": 1,
      "eval.sets.hard.k": 3}))
  result = train(config)
  record = read_records(tmp_path / "run")[0]
  # the default held-out set keeps its keys; the named sets are under their names
  for key in ("eval/accuracy", "eval/avg@2", "eval/hard/accuracy", "eval/hard/avg@3",
              "eval/hard/pass@3", "eval/cold/avg@2", "eval/cold/pass@2"):
    assert 0.0 <= record[key] <= 1.0, key
  assert "eval/cold/accuracy" not in record   # greedy=False: no greedy pass
  # k=0: the greedy completion alone (a sampler with n=0 crashed the first evaluation)
  assert 0.0 <= record["eval/quick/accuracy"] <= 1.0
  assert not [k for k in record if k.startswith("eval/quick/") and "@" in k], sorted(record)
  assert record["eval/hard/response_length_mean"] > 0
  saved = json.loads((tmp_path / "run" / "result.json").read_text())
  assert saved == result
  for key in ("heldout_acc_before", "heldout_acc_after", "heldout_avg@2",
              "heldout_hard/accuracy", "heldout_hard/accuracy_before", "heldout_cold/pass@2",
              "heldout_cold/avg@2_before"):
    assert key in result, key


def test_set_fields_are_typed_on_the_command_line():
  got = typed_overrides({"eval.sets.hard.size": "256", "eval.sets.hard.greedy": "false",
                         "eval.sets.hard.temperature": "0.6", "eval.sets.heldout.k": "8",
                         "eval.sets.heldout.size": "64"})
  assert got == {"eval.sets.hard.size": 256, "eval.sets.hard.greedy": False,
                 "eval.sets.hard.temperature": 0.6, "eval.sets.heldout.k": 8,
                 "eval.sets.heldout.size": 64}
  with pytest.raises(UsageError, match="eval.sets.hard.size"):
    typed_overrides({"eval.sets.hard.size": "many"})
  with pytest.raises(UsageError, match="eval.sets.hard.sise"):
    typed_overrides({"eval.sets.hard.sise": "3"})


def test_the_heldout_entry_sets_the_default_evaluation():
  from rljax.train.config.specs import build_specs

  c = base_config()
  c.eval.sets.heldout.k, c.eval.sets.heldout.size = 8, 32
  spec = build_specs(validate(c), model_description="").rollout
  assert (spec.eval_n, spec.eval_temperature, spec.eval_size) == (8, 1.0, 32)
  plain = build_specs(validate(base_config()), model_description="").rollout
  assert (plain.eval_n, plain.eval_temperature, plain.eval_size) == (4, 1.0, 0)


@pytest.mark.parametrize("change, field", [
    (lambda c: setattr(c.eval.sets, "x", eval_set("nope:2")), "eval.sets.x.source"),
    (lambda c: setattr(c.eval.sets, "x", eval_set("arithmetic:0")), "eval.sets.x.source"),
    (lambda c: setattr(c.eval.sets, "x", eval_set("missing.jsonl")), "eval.sets.x.source"),
    (lambda c: setattr(c.eval.sets, "x", eval_set(k=-1)), "eval.sets.x.k"),
    (lambda c: setattr(c.eval.sets, "x", eval_set(greedy=False, k=0)), "eval.sets.x"),
    (lambda c: setattr(c.eval.sets, "x", ConfigDict(dict(source="heldout", sise=3))),
     "eval.sets.x has unknown fields"),
    (lambda c: setattr(c.eval.sets.heldout, "greedy", False), "eval.sets.heldout"),
    (lambda c: setattr(c.eval.sets.heldout, "size", 999), "eval.sets.heldout.size"),
])
def test_invalid_sets_are_named(change, field):
  c = base_config()
  change(c)
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    validate(c)


def test_a_set_that_shares_prompts_with_training_is_warned_about(tmp_path, capsys):
  """An `eval.sets` entry pointing at the training JSONL scores training prompts: the run
  says how many (90 % of the file's 40 rows train; the set reads all 40)."""
  from rljax.train.rollout.evaluate import training_overlap
  from rljax.train.run.build import build

  path = tmp_path / "data.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"Q{i}:{i % 10}+{i % 7}\n",
                                      "answer": str(i % 10 + i % 7)}) + "\n" for i in range(40)))
  experiment = tmp_path / "again.py"
  experiment.write_text(textwrap.dedent(f'''
      from rljax.train.config import base_config, eval_set

      def get_config(arg=None):
        c = base_config()
        c.task.name, c.task.jsonl_path = "jsonl", {str(path)!r}
        c.eval.sets.again = eval_set({str(path)!r})
        return c
  '''))
  config = load_config(str(experiment), dict(MICRO, **{"run.dir": str(tmp_path / "run")}))
  run = build(config)
  train_prompts = run.task.train_prompts()
  shared = training_overlap(run.eval_sets[0].prompts, train_prompts)
  assert shared == len(train_prompts) and 0 < shared < 40
  assert (f"eval.sets.again: {shared} of its 40 prompts are training prompts"
          in capsys.readouterr().out)
  assert training_overlap(run.heldout_prompts(), train_prompts) == 0
