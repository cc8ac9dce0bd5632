"""Dynamic-sampling buffer (DAPO filter, refill over rounds, give-up error) and JSONL source."""

import numpy as np
import pytest

from rljax.data import (
  DynamicSamplingBuffer,
  DynamicSamplingError,
  filter_groups_bg,
  group_keep_mask,
  load_jsonl_prompts,
  prompts_from_records,
)


def test_group_keep_mask_golden():
  scores = [1, 1, 0, 1, 0, 0, 0.5]
  gid = [0, 0, 1, 1, 2, 2, 3]  # all-equal, mixed, all-equal, singleton
  np.testing.assert_array_equal(group_keep_mask(scores, gid), [0, 0, 1, 1, 0, 0, 1])
  np.testing.assert_array_equal(filter_groups_bg([[1, 1], [0, 1], [0, 0]]), [0, 1, 0])
  np.testing.assert_array_equal(filter_groups_bg([[1], [0]]), [1, 1])


def _round(pattern, offset):
  """Groups of 2 samples; pattern[k] True -> mixed scores, False -> all equal."""
  scores = np.array([[1.0, 0.0] if mixed else [1.0, 1.0] for mixed in pattern]).ravel()
  gid = np.repeat(np.arange(len(pattern)), 2) + 100 * offset
  tokens = np.arange(len(scores))[:, None] + 1000 * offset
  return scores, gid, tokens


def test_buffer_refills_over_rounds_and_truncates():
  buf = DynamicSamplingBuffer(target_groups=3, max_rounds=5)
  s, g, t = _round([True, False, False], 0)
  assert buf.add(s, g, tokens=t, prompt=[f"a{i}" for i in range(6)]) == 1 and not buf.ready
  s, g, t = _round([True, True, True], 1)
  assert buf.add(s, g, tokens=t, prompt=[f"b{i}" for i in range(6)]) == 2 and buf.ready
  st = buf.stats()
  assert st["rounds"] == 2 and st["groups_seen"] == 6
  assert st["filtered_fraction"] == pytest.approx(2 / 6)
  out = buf.take()
  np.testing.assert_array_equal(out["group_id"], [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(out["tokens"][:, 0], [0, 1, 1000, 1001, 1002, 1003])
  assert out["prompt"] == ["a0", "a1", "b0", "b1", "b2", "b3"]
  np.testing.assert_array_equal(out["scores"], [1, 0, 1, 0, 1, 0])
  assert buf.last_stats["rounds"] == 2 and buf.rounds == 0 and not buf.ready


def test_buffer_gives_up_after_max_rounds_and_no_limit_when_nonpositive():
  buf = DynamicSamplingBuffer(target_groups=2, max_rounds=3)
  s, g, _ = _round([False, False], 0)
  buf.add(s, g)
  buf.add(s, g)
  with pytest.raises(DynamicSamplingError, match="0/2 groups .* after 3 rounds"):
    buf.add(s, g)
  unlimited = DynamicSamplingBuffer(target_groups=2, max_rounds=0)
  for _ in range(50):
    unlimited.add(s, g)
  assert unlimited.rounds == 50 and not unlimited.ready
  with pytest.raises(RuntimeError, match="0/2"):
    unlimited.take()
  with pytest.raises(ValueError, match="rows"):
    unlimited.add(s, g, tokens=np.zeros((3, 1)))


def test_jsonl_source_and_errors(tmp_path):
  good = tmp_path / "p.jsonl"
  good.write_text('{"prompt": "1+1=", "answer": 2, "level": 3}\n\n{"prompt": "x", "answer": "y"}\n')
  with pytest.raises(ValueError, match=r"p.jsonl:3: missing field\(s\) \[.level.\]"):
    load_jsonl_prompts(str(good), difficulty_field="level")  # line 3 lacks "level"
  ps = load_jsonl_prompts(str(good))
  assert [(p.text, p.answer, p.difficulty) for p in ps] == [("1+1=", "2", 1), ("x", "y", 1)]
  assert ps[0].id.startswith("p.jsonl:1-") and ps[1].id.startswith("p.jsonl:3-")
  empty = tmp_path / "e.jsonl"
  empty.write_text("\n\n")
  with pytest.raises(ValueError, match="is empty"):
    load_jsonl_prompts(str(empty))
  bad = tmp_path / "b.jsonl"
  bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a", "answer": }\n')
  with pytest.raises(ValueError, match=r"b.jsonl:2: malformed JSON"):
    load_jsonl_prompts(str(bad))
  bad.write_text('{"prompt": "a", "answer": "b"}\n[1, 2]\n')
  with pytest.raises(ValueError, match=r"b.jsonl:2: expected a JSON object"):
    load_jsonl_prompts(str(bad))
  missing = tmp_path / "m.jsonl"
  missing.write_text('{"question": "a", "answer": "b"}\n')
  with pytest.raises(ValueError, match=r"m.jsonl:1: missing field\(s\) \['prompt'\]"):
    load_jsonl_prompts(str(missing))
  with pytest.raises(FileNotFoundError):
    load_jsonl_prompts(str(tmp_path / "none.jsonl"))


def test_records_source_decodes_bytes_and_names_the_row():
  rows = [{"q": b"1+1=", "a": b"2", "id": b"x"}, {"q": "2+2=", "a": 4, "id": "y"}]
  ps = prompts_from_records(rows, source="tfds", text_field="q", answer_field="a", id_field="id")
  assert [(p.id, p.text, p.answer) for p in ps] == [("x", "1+1=", "2"), ("y", "2+2=", "4")]
  tpl = prompts_from_records(rows[:1], text_field="q", answer_field="a",
                             template=lambda t: f"user: {t}\nassistant:")
  assert tpl[0].text == "user: 1+1=\nassistant:" and tpl[0].id.startswith("records:0-")
  with pytest.raises(ValueError, match=r"hf:1: missing field\(s\) \['q'\]"):
    prompts_from_records([rows[0], {"a": 1}], source="hf", text_field="q", answer_field="a")
  with pytest.raises(ValueError, match="no rows"):
    prompts_from_records([])


def test_best_of_k_rejection_sampling():
  from rljax.data.rejection import best_of_k, rejection_sft_pairs

  scores = [0.0, 1.0, 1.0, 0.2, 0.1, 0.0, 0.5]
  gid = [7, 7, 7, 3, 3, 3, 9]
  np.testing.assert_array_equal(best_of_k(scores, gid), [1, 3, 6])  # first max on ties
  np.testing.assert_array_equal(best_of_k(scores, gid, min_score=0.5), [1, 6])
  pairs = rejection_sft_pairs(list("abcdefg"), [f"c{i}" for i in range(7)], scores, gid,
                              min_score=1.0)
  assert pairs == [("b", "c1")]
