"""Prompt samplers: uniform, curriculum by difficulty, prioritized by online success rate.

Kimi k1.5 (arXiv:2501.12599, Sec. 2.3.4 "Sampling Strategies"):
(a) curriculum sampling, from easy to hard tasks; (b) prioritized sampling, probability
∝ (1 − s_i) for the success rate s_i of problem i.

Every sampler is deterministic given its seed and state. `state_dict()` returns plain
Python / NumPy values (the PRNG state of `numpy.random.PCG64` included) that can be
stored in a checkpoint; `load_state_dict` restores them exactly. `sample(batch_size)`
returns int64 prompt indices [batch_size]; each call is one step.
"""

from __future__ import annotations

import numpy as np


class _Base:
  def __init__(self, n: int, *, seed: int):
    if n <= 0:
      raise ValueError(f"{type(self).__name__}: need at least one prompt, got {n}")
    self.n = int(n)
    self.rng = np.random.Generator(np.random.PCG64(seed))
    self.step = 0

  def state_dict(self) -> dict:
    return {"step": self.step, "rng": self.rng.bit_generator.state}

  def load_state_dict(self, state: dict) -> None:
    self.step = int(state["step"])
    self.rng.bit_generator.state = state["rng"]

  def update(self, indices, successes) -> None:
    """Success feedback (ignored by samplers that do not use it)."""


class UniformSampler(_Base):
  """Shuffled epochs: every prompt once per epoch, a fresh permutation each epoch.

  Args:
    n: number of prompts.
    seed: PRNG seed.
  """

  def __init__(self, n: int, *, seed: int):
    super().__init__(n, seed=seed)
    self.perm = self.rng.permutation(self.n)
    self.pos = 0
    self.epoch = 0

  def sample(self, batch_size: int) -> np.ndarray:
    out = []
    while len(out) < batch_size:
      take = min(batch_size - len(out), self.n - self.pos)
      out.extend(self.perm[self.pos:self.pos + take])
      self.pos += take
      if self.pos == self.n:
        self.perm, self.pos, self.epoch = self.rng.permutation(self.n), 0, self.epoch + 1
    self.step += 1
    return np.asarray(out, np.int64)

  def state_dict(self) -> dict:
    return dict(super().state_dict(), perm=self.perm.copy(), pos=self.pos, epoch=self.epoch)

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.perm = np.asarray(state["perm"], np.int64)
    self.pos, self.epoch = int(state["pos"]), int(state["epoch"])


def curriculum_level_probs(levels: np.ndarray, step: int, *, ramp_steps: int,
                           width: float) -> np.ndarray:
  """Probability of each difficulty level at `step` (easy -> hard).

  c(t) = lo + (hi − lo)·min(1, t / ramp_steps),  p(d) ∝ exp(−(d − c(t))² / (2·width²)).

  Args:
    levels: the distinct difficulty levels present, sorted ascending [K].
    step: the sampler step t.
    ramp_steps: steps to move the centre from the easiest to the hardest level.
    width: spread in levels (small: one level at a time; large: near uniform).
  Returns:
    float64 [K], sums to 1.
  """
  lo, hi = float(levels[0]), float(levels[-1])
  centre = lo + (hi - lo) * min(1.0, step / max(ramp_steps, 1))
  logits = -((levels - centre) ** 2) / (2.0 * width ** 2)
  w = np.exp(logits - logits.max())
  return w / w.sum()


class CurriculumSampler(_Base):
  """Curriculum by difficulty (Kimi k1.5 curriculum sampling): a level is drawn from
  `curriculum_level_probs` at the current step, then a prompt uniformly within the level.

  Args:
    difficulties: int difficulty of each prompt [N] (e.g. `[p.difficulty for p in prompts]`).
    seed: PRNG seed.
    ramp_steps: steps until the hardest level is the centre.
    width: spread of the level distribution, in levels.
  Note: the paper gives no schedule; the Gaussian-over-levels ramp is rljax's choice.
  """

  def __init__(self, difficulties, *, seed: int, ramp_steps: int = 100, width: float = 0.5):
    d = np.asarray(difficulties, np.int64)
    super().__init__(len(d), seed=seed)
    if width <= 0:
      raise ValueError(f"CurriculumSampler: width must be > 0, got {width}")
    self.levels = np.unique(d)
    self.members = [np.flatnonzero(d == lv) for lv in self.levels]
    self.ramp_steps, self.width = int(ramp_steps), float(width)

  def level_probs(self, step: int | None = None) -> np.ndarray:
    return curriculum_level_probs(self.levels.astype(np.float64),
                                  self.step if step is None else step,
                                  ramp_steps=self.ramp_steps, width=self.width)

  def prompt_probs(self, step: int | None = None) -> np.ndarray:
    """Probability of each prompt at `step` (default: the next call) [N]."""
    p = np.zeros(self.n)
    for prob, m in zip(self.level_probs(step), self.members):
      p[m] = prob / len(m)
    return p

  def sample(self, batch_size: int) -> np.ndarray:
    lv = self.rng.choice(len(self.levels), size=batch_size, p=self.level_probs())
    out = np.array([self.members[k][self.rng.integers(len(self.members[k]))] for k in lv],
                   np.int64)
    self.step += 1
    return out


class PrioritizedSampler(_Base):
  """Prioritized sampling (Kimi k1.5): p_i ∝ max(1 − s_i, floor), s_i tracked online.

  s_i ← (1 − α)·s_i + α·success for each observed result of prompt i (the first result
  sets s_i directly); unseen prompts have s_i = `init_success`.

  Args:
    n: number of prompts.
    seed: PRNG seed.
    floor: least priority, so solved prompts keep a small probability (> 0).
    alpha: EMA rate of the success estimate.
    init_success: success rate assumed before a prompt is first seen.
  Note: samples are drawn with replacement, so p_i holds exactly per draw; the paper
  leaves the estimator unspecified (rljax: EMA; floor added).
  """

  def __init__(self, n: int, *, seed: int, floor: float = 0.05, alpha: float = 0.5,
               init_success: float = 0.0):
    super().__init__(n, seed=seed)
    if not 0 < floor <= 1 or not 0 < alpha <= 1:
      raise ValueError(f"PrioritizedSampler: need 0 < floor <= 1 and 0 < alpha <= 1, got "
                       f"floor={floor}, alpha={alpha}")
    self.floor, self.alpha = float(floor), float(alpha)
    self.success = np.full(self.n, float(init_success))
    self.seen = np.zeros(self.n, bool)

  def prompt_probs(self) -> np.ndarray:
    w = np.maximum(1.0 - self.success, self.floor)
    return w / w.sum()

  def sample(self, batch_size: int) -> np.ndarray:
    out = self.rng.choice(self.n, size=batch_size, p=self.prompt_probs()).astype(np.int64)
    self.step += 1
    return out

  def update(self, indices, successes) -> None:
    """Feeds back results: `successes[k]` in [0, 1] (e.g. group mean accuracy) of `indices[k]`."""
    for i, s in zip(np.asarray(indices).ravel(), np.asarray(successes, float).ravel()):
      if not 0.0 <= s <= 1.0:
        raise ValueError(f"PrioritizedSampler.update: success {s} of prompt {i} not in [0, 1]")
      self.success[i] = s if not self.seen[i] else (1 - self.alpha) * self.success[i] + self.alpha * s
      self.seen[i] = True

  def state_dict(self) -> dict:
    return dict(super().state_dict(), success=self.success.copy(), seen=self.seen.copy())

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.success = np.asarray(state["success"], float).copy()
    self.seen = np.asarray(state["seen"], bool).copy()


SAMPLERS = {"uniform": UniformSampler, "curriculum": CurriculumSampler,
            "prioritized": PrioritizedSampler}


def make_sampler(name: str, prompts, *, seed: int, **kwargs):
  """Builds a sampler over `prompts` (a list of `Prompt`) by name.

  Raises:
    KeyError: on an unknown name, listing the valid ones.
  """
  if name not in SAMPLERS:
    raise KeyError(f"unknown sampler {name!r}; valid names: {sorted(SAMPLERS)}")
  if name == "curriculum":
    return CurriculumSampler([p.difficulty for p in prompts], seed=seed, **kwargs)
  return SAMPLERS[name](len(prompts), seed=seed, **kwargs)
