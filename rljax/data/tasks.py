"""Synthetic verifiable tasks generated locally from a seed: the embedded default of rljax.

Two tasks, each with difficulty levels, a rule-based verifier (accuracy + format reward)
and SFT demonstrations:

- `"arithmetic"`: a chain of additions/subtractions solved with a scratchpad of one line
  per step, so completion length grows with difficulty (length tricks become visible).
  Prompt `Q:3+5-7\\n`, demonstration `3+5=8\\n8-7=1\\n<answer>1</answer>`; operands have
  `digits` digits (default 1; 2 is much harder: see the calibration note below).
- `"countdown"`: reach a target from given numbers with + - * and parentheses, each
  number used exactly once (TinyZero's rule); many answers are correct.
  Prompt `N:3 5 7 T:56\\n`, demonstration `5+3=8\\n8*7=56\\n<answer>(5+3)*7</answer>`.

The held-out split is FIXED and disjoint from training by construction: a problem is
held-out iff a hash of its canonical text falls in the held-out bucket, whatever the
seed or difficulty. Held-out prompts come from `heldout_seed` (default fixed), training
prompts from `seed`.

Lengths are counted in `CharTokenizer` tokens (one per character; `<answer>` and
`</answer>` are one token each) and exclude bos/eos.

Calibration (measured with a standalone pure-JAX script, not in the repo): a 0.82M-parameter
4-layer char transformer, SFT with AdamW (peak lr 3e-3, batch 64) on demonstrations,
greedy held-out accuracy on arithmetic difficulty (1, 3), digits=1: 12% after 150 steps,
45% after 300, 82% after 500; with digits=2: 1% after 400 steps. Countdown difficulty
(2, 3): 2.5% after 150 steps, 9% after 300, 17% after 500.

The format of "think, then answer in a tag" follows DeepSeek-R1 (arXiv:2501.12948, Sec.
2.2.2: accuracy reward plus format reward); the countdown task follows TinyZero.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable

from rljax.answers.tags import ANSWER_RE, parse_answer_tag  # noqa: F401 (public here too)
from rljax.data import calculator as calc
from rljax.data import countdown as cd

# task options giving the share of demonstrations that show the worked mode
WORKED_OPTIONS = ("scratchpad_fraction", "tool_fraction")
_HELDOUT_BUCKETS = 1000


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One problem. `answer` is the ground truth string (countdown: the target)."""
  id: str
  text: str
  answer: str
  difficulty: int


class RewardBreakdown(dict):
  """Scores of one completion: `total`, `accuracy` (0/1) and `format` (0/1).

  A dict (so extra components can be logged) with attribute access.
  """
  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None


def _difficulty_range(difficulty) -> tuple[int, int]:
  if isinstance(difficulty, int):
    lo = hi = difficulty
  else:
    lo, hi = (int(x) for x in difficulty)
  if not 1 <= lo <= hi:
    raise ValueError(f"difficulty must be an int >= 1 or a (lo, hi) range with 1 <= lo <= hi, "
                     f"got {difficulty!r}")
  return lo, hi


def _is_heldout(key: str, fraction: float) -> bool:
  h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
  return (h % _HELDOUT_BUCKETS) < round(fraction * _HELDOUT_BUCKETS)


class Task:
  """A synthetic task: prompts, demonstrations, verifier, length budgets.

  Attributes:
    name: registry name.
    difficulty_range: (lo, hi) levels mixed uniformly in the prompt lists.
    max_prompt_len: upper bound on prompt tokens (CharTokenizer, no bos) at any level in range.
    max_completion_len: upper bound on demonstration tokens (no eos) at any level in range.
    accuracy_weight, format_weight: weights of `total` in `score`.
  """

  def __init__(self, name: str, spec: TaskSpec, *, difficulty, seed: int, n_train: int = 4096,
               n_heldout: int = 256, heldout_seed: int = 12345, heldout_fraction: float = 0.1,
               accuracy_weight: float = 1.0, format_weight: float = 0.1, **options):
    self.name, self.spec, self.options = name, spec, options
    self.tags, self.observation_re = spec.tags, spec.observation_re
    self.difficulty_range = _difficulty_range(difficulty)
    self.seed, self.heldout_seed, self.heldout_fraction = seed, heldout_seed, heldout_fraction
    self.n_train, self.n_heldout = n_train, n_heldout
    self.accuracy_weight, self.format_weight = accuracy_weight, format_weight
    lo, hi = self.difficulty_range
    self.max_prompt_len = max(spec.prompt_len(d, **options) for d in range(lo, hi + 1))
    self.max_completion_len = max(spec.completion_len(d, **options) for d in range(lo, hi + 1))
    self._train = self._heldout = None

  def train_prompts(self) -> list[Prompt]:
    """Up to `n_train` distinct training prompts from `seed` (fewer if the space is small)."""
    if self._train is None:
      self._train = self._generate(self.seed, self.n_train, heldout=False)
    return self._train

  def heldout_prompts(self) -> list[Prompt]:
    """Up to `n_heldout` distinct held-out prompts from `heldout_seed`; never in training."""
    if self._heldout is None:
      self._heldout = self._generate(self.heldout_seed, self.n_heldout, heldout=True)
    return self._heldout

  def _generate(self, seed: int, n: int, *, heldout: bool) -> list[Prompt]:
    rng = random.Random(f"{self.name}/{seed}/{heldout}")
    lo, hi = self.difficulty_range
    seen, out = set(), []
    for _ in range(50 * n):
      if len(out) == n:
        break
      d = rng.randint(lo, hi)
      text, answer = self.spec.generate(rng, d, **self.options)
      if text in seen or _is_heldout(text, self.heldout_fraction) != heldout:
        continue
      seen.add(text)
      pid = f"{self.name}-d{d}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
      out.append(Prompt(id=pid, text=text, answer=answer, difficulty=d))
    return out

  def demonstration(self, prompt: Prompt, *, worked: bool = False) -> str:
    """An SFT target completion ending with `</answer>` (the trainer appends eos).

    worked=True: always the worked solution (arithmetic: the scratchpad; calculator: the
    tool call), whatever the task's fraction option says; the first phase of a two-phase
    warm start uses it.
    """
    key = next((k for k in WORKED_OPTIONS if k in self.options), None)
    options = dict(self.options, **{key: 1.0}) if worked and key else self.options
    return self.spec.demonstration(prompt, **options)

  def worked(self, completion: str) -> float:
    """1.0 when the completion uses the task's worked mode (arithmetic: a scratchpad line
    before the answer; calculator: a tool call), else 0.0; NaN for a task without one."""
    if self.spec.worked is None:
      return float("nan")
    return float(self.spec.worked(completion))

  def score(self, prompt: Prompt, completion: str) -> RewardBreakdown:
    """Rule-based reward: accuracy (first answer block correct) and format (well formed).

    total = accuracy_weight * accuracy + format_weight * format.
    """
    content, well_formed = parse_answer_tag(completion)
    acc = float(content is not None and self.spec.check(prompt, content))
    fmt = float(well_formed)
    return RewardBreakdown(total=self.accuracy_weight * acc + self.format_weight * fmt,
                           accuracy=acc, format=fmt)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """The functions that define a task (all pure; `options` are task keyword options)."""
  generate: Callable  # (rng, difficulty, **options) -> (prompt_text, answer)
  demonstration: Callable  # (prompt, **options) -> completion text
  check: Callable  # (prompt, answer_content) -> bool
  prompt_len: Callable  # (difficulty, **options) -> max prompt tokens
  completion_len: Callable  # (difficulty, **options) -> max demonstration tokens
  tags: tuple = ()  # extra CharTokenizer tags the task writes (one token each)
  observation_re: object = None  # compiled regex: demonstration spans an environment writes
  worked: Callable | None = None  # (completion) -> bool: it uses the worked mode


# ---------------------------------------------------------------- arithmetic
def _arith_generate(rng, d, *, digits=1, ops="+-", scratchpad_fraction=1.0):
  del scratchpad_fraction
  if not ops or set(ops) - set("+-"):
    raise ValueError(f"arithmetic: ops must be a non-empty subset of '+-', got {ops!r}")
  terms = [rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1)
           for _ in range(d + 1)]
  text = str(terms[0]) + "".join(rng.choice(ops) + str(t) for t in terms[1:])
  return f"Q:{text}\n", str(_arith_steps(text)[-1][1])


def _arith_steps(expr: str) -> list[tuple[str, int]]:
  """Left-to-right steps of a chain `a op b op c ...` -> [("a op b", value), ...]."""
  toks = re.findall(r"\d+|[+\-]", expr)
  acc = int(toks[0])
  steps = []
  for op, x in zip(toks[1::2], toks[2::2]):
    new = acc + int(x) if op == "+" else acc - int(x)
    steps.append((f"{acc}{op}{x}", new))
    acc = new
  return steps


def shows_scratchpad(prompt_text: str, fraction: float) -> bool:
  """Whether the demonstration of this prompt shows its worked steps.

  Fixed per prompt (a hash of its text), so a `fraction` of the prompts, at every
  difficulty, carry scratchpads and the rest answer-only demonstrations: the "rare
  scratchpad" mixture of Tsilivis et al. 2025 (arXiv:2510.11495), where next-token SFT
  follows the answer-only majority and RL can promote the rare, reliable long mode.
  """
  if fraction >= 1.0:
    return True
  h = int.from_bytes(hashlib.sha256(f"scratchpad/{prompt_text}".encode()).digest()[:8], "big")
  return (h % _HELDOUT_BUCKETS) < round(fraction * _HELDOUT_BUCKETS)


def _arith_demo(prompt, *, scratchpad_fraction=1.0, **_):
  answer = f"<answer>{prompt.answer}</answer>"
  if not shows_scratchpad(prompt.text, scratchpad_fraction):
    return answer
  expr = prompt.text[2:].strip()
  lines = [f"{lhs}={v}" for lhs, v in _arith_steps(expr)]
  return "\n".join(lines) + "\n" + answer


def _arith_check(prompt, content):
  return re.fullmatch(r"-?\d+", content) is not None and int(content) == int(prompt.answer)


def _arith_max_value_len(d, digits, ops):
  # |partial result| <= (d+1) * (10^digits - 1); one more char for a minus sign.
  return len(str((d + 1) * (10 ** digits - 1))) + ("-" in ops)


def _arith_prompt_len(d, *, digits=1, ops="+-", **_):
  return 2 + (d + 1) * digits + d + 1


def _arith_completion_len(d, *, digits=1, ops="+-", **_):
  v = _arith_max_value_len(d, digits, ops)
  step = v + 1 + digits + 1 + v + 1  # "acc op x = new \n"
  return d * step + 2 + v  # steps + "<answer>" v "</answer>" (tags are one token each)


# ---------------------------------------------------------------- registry
TASKS: dict[str, TaskSpec] = {
  "arithmetic": TaskSpec(_arith_generate, _arith_demo, _arith_check, _arith_prompt_len,
                         _arith_completion_len,
                         worked=lambda text: "=" in text.split("<answer>")[0]),
  "countdown": TaskSpec(cd.generate, cd.demonstration, cd.check, cd.prompt_len,
                        cd.completion_len),
  "calculator": TaskSpec(calc.generate, calc.demonstration, calc.check, calc.prompt_len,
                         calc.completion_len, tags=calc.TAGS,
                         observation_re=calc.OBSERVATION_RE,
                         worked=lambda text: "<call>" in text),
}

RECOMMENDED_DIFFICULTY = {"arithmetic": (1, 3), "countdown": (2, 3)}


def make_task(name: str, *, difficulty, seed: int, **kwargs) -> Task:
  """Builds a synthetic task.

  Args:
    name: a key of `TASKS` ("arithmetic", "countdown").
    difficulty: an int level >= 1 or an inclusive (lo, hi) range mixed uniformly.
      arithmetic: d + 1 terms; countdown: d + 1 numbers.
    seed: seed of the training prompts (held-out prompts use `heldout_seed`).
    **kwargs: `n_train`, `n_heldout`, `heldout_seed`, `heldout_fraction`,
      `accuracy_weight`, `format_weight`, and task options (arithmetic: `digits=1`,
      `ops="+-"`; countdown: `max_number=9`, `max_target=99`).
  Returns:
    a `Task`.
  """
  if name not in TASKS:
    raise KeyError(f"unknown task {name!r}; valid names: {sorted(TASKS)}")
  return Task(name, TASKS[name], difficulty=difficulty, seed=seed, **kwargs)
