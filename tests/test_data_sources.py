"""Prompt sources: Hugging Face `datasets` and TFDS rows through the same task as JSONL.

No network: every dataset is built in tmp_path (`save_to_disk`, a local JSON/parquet file,
a tiny TFDS builder prepared as array_record).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from train_micro import micro_config, read_records

from rljax.data.jsonl_task import JsonlTask
from rljax.data.records_task import RecordsTask, make_answer_extractor, tagged_demonstration
from rljax.data.sources import load_hf_rows, load_tfds_rows
from rljax.train.config import ConfigError, apply_overrides, base_config, validate
from rljax.train.loop import train
from rljax.train.run.task_and_models import build_task

GSM8K = dict(prompt_field="question", answer_field="answer", solution_field="answer",
             answer_extractor="gsm8k")


def gsm8k_rows(n):
  """GSM8K-shaped rows: calculator annotations and a '#### 1,234' final line."""
  rows = []
  for i in range(n):
    a, b = 10 + i, 1000 + 7 * i
    rows.append({"question": f"Tom has {a} apples and buys {b} more (#{i}). How many now?",
                 "answer": f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b:,}"})
  return rows


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def split_of(task):
  key = lambda p: (p.text, p.answer)  # noqa: E731
  return sorted(map(key, task.train_prompts())), sorted(map(key, task.heldout_prompts()))


@pytest.fixture
def hf(tmp_path, monkeypatch):
  """The `datasets` module (tests skip without it), caching under tmp_path."""
  datasets = pytest.importorskip("datasets")
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  return datasets


def test_answer_extractors_golden():
  gsm8k = make_answer_extractor("gsm8k")
  assert gsm8k("48/2 = <<48/2=24>>24\n#### 1,234") == "1234"
  assert gsm8k("#### 5\nmore #### 72 ") == "72"
  assert gsm8k("no final line") == ""
  boxed = make_answer_extractor("boxed")
  assert boxed(r"so \boxed{2} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
  assert boxed("no box here") == ""
  assert make_answer_extractor("none")("  42\n") == "42"
  regex = make_answer_extractor("regex", r"answer is (\S+?)\.")
  assert regex("The answer is 5. No, the answer is 7.") == "7"
  with pytest.raises(ValueError, match="task.answer_regex"):
    make_answer_extractor("regex", r"answer is \S+")          # no group
  with pytest.raises(ValueError, match="task.answer_regex"):
    make_answer_extractor("regex", r"(unclosed")
  with pytest.raises(ValueError, match="task.answer_extractor='last'.*'gsm8k'"):
    make_answer_extractor("last")


def test_hf_sources_give_the_jsonl_task(hf, tmp_path):
  """save_to_disk dir, a JSON file and a parquet file -> the same prompts and split as JSONL."""
  rows = gsm8k_rows(60)
  jsonl = write_jsonl(tmp_path / "gsm.jsonl", rows)
  reference = JsonlTask(jsonl, **GSM8K)
  train, heldout = split_of(reference)
  assert len(train) + len(heldout) == 60 and heldout
  expected = {r["question"]: str(10 + i + 1000 + 7 * i) for i, r in enumerate(rows)}
  assert dict(train + heldout) == expected       # "#### 1,010" -> "1010"

  ds = hf.Dataset.from_list(rows)
  hf.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(tmp_path / "dd")
  ds.to_parquet(str(tmp_path / "gsm.parquet"))
  for path in (tmp_path / "dd", jsonl, tmp_path / "gsm.parquet"):
    hf_rows = load_hf_rows(str(path), split="train", columns=["question", "answer"])
    task = RecordsTask(hf_rows, source=str(path), **GSM8K)
    assert split_of(task) == (train, heldout), path
    for p, q in zip(task.train_prompts(), reference.train_prompts()):
      assert task.demonstration(p) == reference.demonstration(q)
  assert len(load_hf_rows(jsonl, split="train[:5]")) == 5


def test_score_correct_wrong_and_untagged(tmp_path):
  task = RecordsTask(gsm8k_rows(40), source="gsm", format_weight=0.1, **GSM8K)
  p = task.train_prompts()[0]
  assert p.answer.isdigit() and int(p.answer) > 1000
  right = task.score(p, f"so {p.answer}\n<answer>{p.answer}</answer>")
  wrong = task.score(p, f"<answer>{int(p.answer) + 1}</answer>")
  untagged = task.score(p, f"so the total is \\boxed{{{int(p.answer):,}}}")
  assert (right.accuracy, right.format, right.total) == (1.0, 1.0, pytest.approx(1.1))
  assert (wrong.accuracy, wrong.format, wrong.total) == (0.0, 1.0, pytest.approx(0.1))
  assert (untagged.accuracy, untagged.format) == (1.0, 0.0)


def test_prompt_template_keeps_the_split():
  rows = gsm8k_rows(40)
  plain = RecordsTask(rows, source="gsm", **GSM8K)
  wrapped = RecordsTask(rows, source="gsm", prompt_template="Solve: {prompt}\nEnd with <answer>.",
                        **GSM8K)
  assert [f"Solve: {p.text}\nEnd with <answer>." for p in plain.heldout_prompts()] == \
      [p.text for p in wrapped.heldout_prompts()]


def test_hf_errors_name_the_field(hf, tmp_path):
  rows = gsm8k_rows(30)
  hf.Dataset.from_list(rows).save_to_disk(tmp_path / "one")
  ds = hf.Dataset.from_list(rows)
  hf.DatasetDict({"train": ds, "dev": ds.select(range(2))}).save_to_disk(tmp_path / "dd")
  with pytest.raises(ValueError, match=r"task.prompt_field='problem'.*\['answer', 'question'\]"):
    RecordsTask(load_hf_rows(str(tmp_path / "one"), columns=["problem", "answer"]), source="x",
                prompt_field="problem")
  with pytest.raises(ValueError, match=r"task.hf_split='test' is not a split.*\['dev', 'train'\]"):
    load_hf_rows(str(tmp_path / "dd"), split="test")
  jsonl = write_jsonl(tmp_path / "g.jsonl", rows)
  with pytest.raises(ValueError, match="task.hf_split='validation'.*Unknown split"):
    load_hf_rows(jsonl, split="validation")
  with pytest.raises(ValueError, match="task.hf_path=.*no_such_dir.*no such dataset"):
    load_hf_rows(str(tmp_path / "no_such_dir"))
  with pytest.raises(ValueError, match=r"task.hf_split='train\[:0\]'.*corresponds to no data"):
    load_hf_rows(jsonl, split="train[:0]")
  rows[3]["answer"] = "no final line"
  with pytest.raises(ValueError, match=r"gsm:3: task.answer_extractor='gsm8k' finds no answer"):
    RecordsTask(rows, source="gsm", **GSM8K)
  task = RecordsTask(gsm8k_rows(30), source="gsm", prompt_field="question")
  with pytest.raises(ValueError, match="no 'solution' field .task.solution_field"):
    task.demonstration(task.train_prompts()[0])


@pytest.mark.parametrize("fields,needle", [
    ({"task.name": "hf_dataset"}, "task.hf_path is empty"),
    ({"task.name": "tfds"}, "task.tfds_name is empty"),
    ({"task.answer_extractor": "hashes"}, "task.answer_extractor='hashes'"),
    ({"task.answer_extractor": "regex", "task.answer_regex": "x+"}, "task.answer_regex"),
    ({"task.answer_extractor": "regex", "task.answer_regex": "(x"}, "does not compile"),
    ({"task.prompt_template": "Solve this"}, "task.prompt_template"),
])
def test_config_validation_names_the_field(fields, needle):
  c = base_config()
  apply_overrides(c, fields)
  with pytest.raises(ConfigError, match=needle):
    validate(c, num_devices=1)


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  """A tiny TFDS dataset `tiny_gsm` prepared as array_record (no TensorFlow involved)."""
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("array_record")
  rows = gsm8k_rows(40)

  class TinyGsm(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      text = tfds.features.Text()
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"question": text, "answer": text, "level": tfds.features.Scalar(np.int32)}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(rows), "test": self._generate_examples(rows[:5])}

    def _generate_examples(self, split_rows):
      for i, r in enumerate(split_rows):
        yield i, dict(r, level=i % 3)

  data_dir = tmp_path_factory.mktemp("tfds")
  TinyGsm(data_dir=str(data_dir), file_format="array_record").download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return str(data_dir)


def test_tfds_source_gives_the_jsonl_task(tfds_dir, tmp_path):
  rows = load_tfds_rows("tiny_gsm", split="train", data_dir=tfds_dir,
                        columns=["question", "answer"])
  assert all(set(r) == {"question", "answer"} and isinstance(r["question"], str) for r in rows)
  reference = JsonlTask(write_jsonl(tmp_path / "g.jsonl", gsm8k_rows(40)), **GSM8K)
  assert split_of(RecordsTask(rows, source="tiny_gsm", **GSM8K)) == split_of(reference)
  assert len(load_tfds_rows("tiny_gsm", split="test", data_dir=tfds_dir)) == 5
  c = base_config()
  apply_overrides(c, {"task.name": "tfds", "task.tfds_name": "tiny_gsm", "task.heldout_size": 64,
                      "task.tfds_data_dir": tfds_dir, "task.prompt_field": "question",
                      "task.solution_field": "answer", "task.answer_extractor": "gsm8k"})
  assert split_of(build_task(validate(c, num_devices=1))) == split_of(reference)
  levels = [r["level"] for r in load_tfds_rows("tiny_gsm:1.0.0", split="train[:10]",
                                                data_dir=tfds_dir)]
  assert len(levels) == 10 and set(levels) <= {0, 1, 2}


def test_tfds_errors_name_the_field(tfds_dir, tmp_path):
  with pytest.raises(ValueError, match="task.tfds_split='validation'.*Unknown split"):
    load_tfds_rows("tiny_gsm", split="validation", data_dir=tfds_dir)
  with pytest.raises(ValueError, match="task.tfds_name='no_such_dataset_xyz'.*no such"):
    load_tfds_rows("no_such_dataset_xyz", data_dir=tfds_dir)
  # The same dataset as if prepared as TFRecord (writing real TFRecords needs TensorFlow).
  shutil.copytree(tfds_dir, tmp_path / "tfr")
  info = tmp_path / "tfr" / "tiny_gsm" / "1.0.0" / "dataset_info.json"
  info.write_text(info.read_text().replace('"array_record"', '"tfrecord"'))
  with pytest.raises(ValueError, match="task.tfds_name='tiny_gsm'.*prepared as TFRecord"):
    load_tfds_rows("tiny_gsm", data_dir=str(tmp_path / "tfr"))


def test_optional_libraries_are_imported_only_when_used(tmp_path):
  path = write_jsonl(tmp_path / "g.jsonl", gsm8k_rows(30))
  code = ("import sys; from rljax.train.config import base_config; "
          "from rljax.train.run.task_and_models import build_task; c = base_config(); "
          f"c.task.name = 'jsonl'; c.task.jsonl_path = {path!r}; "
          "c.task.prompt_field = 'question'; c.task.answer_extractor = 'gsm8k'; "
          "t = build_task(c); assert len(t.train_prompts()) > 20; "
          "print(sorted(m for m in ('datasets', 'tensorflow_datasets', 'tensorflow') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.stdout.strip().splitlines()[-1] == "[]"


def _arith_rows(n):
  rows = []
  for i in range(n):
    a, b = i % 10, (i * 7) % 10
    rows.append({"q": f"Q{i}:{a}+{b}\n", "sum": f"{a}+{b}\n#### {a + b}",
                 "work": f"{a}+{b}={a + b}\n<answer>{a + b}</answer>"})
  return rows


def test_hf_dataset_trains_end_to_end(hf, tmp_path):
  """One SFT-warm-started GRPO iteration on a save_to_disk dataset through build_task."""
  rows = _arith_rows(80)
  hf.Dataset.from_list(rows).save_to_disk(tmp_path / "arith")
  config = micro_config("grpo", tmp_path, **{
      "task.name": "hf_dataset", "task.hf_path": str(tmp_path / "arith"),
      "task.prompt_field": "q", "task.answer_field": "sum", "task.solution_field": "work",
      "task.answer_extractor": "gsm8k", "sft.steps": 0, "run.iterations": 1})
  task = build_task(config)
  bucket = lambda t: int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) % 1000  # noqa: E731
  held = [r["q"] for r in rows if bucket(r["q"]) < 100][:8]       # the 10 % hash bucket
  assert [p.text for p in task.heldout_prompts()] == held and len(held) >= 3
  for p in task.train_prompts():
    a, b = p.text.strip().split(":")[1].split("+")
    assert p.answer == str(int(a) + int(b))
  result = train(config)
  records = read_records(tmp_path / "grpo")
  assert result["iterations"] == 1 and [r["iteration"] for r in records] == [1]
  assert 0.0 <= result["heldout_acc_after"] <= 1.0


def test_demonstrations_end_in_the_answer_tag_the_format_reward_checks():
  """GSM8K's '#### 1,010' line becomes the tag (with the extracted answer); a solution that
  has a tag is unchanged; others get the tag appended; each then scores format 1."""
  task = RecordsTask(gsm8k_rows(40), source="gsm", format_weight=0.1, **GSM8K)
  p = task.train_prompts()[0]
  demo = task.demonstration(p)
  assert "####" not in demo and demo.endswith(f"<answer>{p.answer}</answer>")
  assert task.score(p, demo).format == 1.0 and task.score(p, demo).accuracy == 1.0
  assert tagged_demonstration("x=2\n<answer>2</answer>", "2") == "x=2\n<answer>2</answer>"
  assert tagged_demonstration("so \\boxed{3}", "3") == "so \\boxed{3}\n<answer>3</answer>"
  assert tagged_demonstration("a\nb\n#### 1,200", "1200") == "a\nb\n<answer>1200</answer>"
