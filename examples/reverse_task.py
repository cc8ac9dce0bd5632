"""A task of your own in 30 lines: reverse a word (`task.name="python"`).

    rljax train --config experiments/user_task.py

The same object gives the training and held-out prompts, scores completions, and writes
the SFT demonstrations. Prompts may be dicts, strings or `rljax.data.Prompt`s.
"""

import random


class ReverseWords:
  def __init__(self, seed=0, n_train=2000, n_heldout=128):
    rng = random.Random(seed)
    words = {"".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
             for _ in range(4 * (n_train + n_heldout))}
    words = sorted(words)
    rng.shuffle(words)
    self.held = [{"prompt": f"R:{w}\n", "answer": w[::-1]} for w in words[:n_heldout]]
    self.train = [{"prompt": f"R:{w}\n", "answer": w[::-1]}
                  for w in words[n_heldout:n_heldout + n_train]]

  def train_prompts(self):
    return self.train

  def heldout_prompts(self):
    return self.held

  def score(self, prompt, completion):
    body = completion.removeprefix("<answer>").removesuffix("</answer>").strip()
    return {"score": float(body == prompt["answer"]), "accuracy": float(body == prompt["answer"]),
            "format": float(completion.startswith("<answer>") and completion.endswith("</answer>"))}

  def demonstration(self, prompt):
    return f"<answer>{prompt['answer']}</answer>"


def make_task():
  return ReverseWords()


def brevity(prompt, completion, answer):
  """A second reward (task.reward_fns): 1 for a completion no longer than the answer's tags."""
  return float(len(completion) <= len(answer) + len("<answer></answer>"))
