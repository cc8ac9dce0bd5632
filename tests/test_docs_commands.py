"""Every `rljax ...` command in README.md and docs/*.md works as written.

The commands are read from the pages' fenced code blocks (backslash continuations
joined) and run in a scratch directory that holds what they name: the repository's
`experiments/` and `examples/`, the files the pages themselves show in Python blocks
whose first line is `# NAME.py...` (`my_ablation.py`, `my_rewards.py`, `my_env.py`), and
small stand-ins for the rest (`data.jsonl`, `my_pkg/rewards.py`, a saved run for
`rljax eval`). Each goes through `rljax.cli.main(... + ["--check"])`: the config is parsed
and validated (every step and seed for `rljax ablate`), and the files it names are
loaded; nothing compiles, trains or writes. A command whose line ends with a comment
`# needs ...` (the network, a local checkpoint, a prepared dataset) is parsed and
validated only, then skipped with that reason.
"""

import dataclasses
import json
import pathlib
import re
import shlex
import sys

import pytest

from rljax import cli
from rljax.cli.reward_model import parse_reward_model_args
from rljax.train.config import load_config

REPO = pathlib.Path(__file__).parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
NEEDS = re.compile(r"\s#\s*needs\b\s*(.*)$")
SUBCOMMAND = re.compile(r"\brljax\s+(train|ablate|eval|plan|reward-model)\b")


@dataclasses.dataclass
class Command:
  where: str       # "README.md:123", the line the command starts on
  text: str        # the command, continuations joined
  argv: list       # after `rljax` / `python -m rljax`, comments dropped
  needs: str       # the reason of a `# needs ...` comment, "" without


def fenced_blocks(page):
  """(language, first line number, lines) of every fenced code block of a Markdown page."""
  lang, start, lines = None, 0, []
  for number, line in enumerate(page.read_text().splitlines(), 1):
    if line.startswith("```"):
      if lang is None:
        lang, start, lines = line[3:].strip(), number + 1, []
      else:
        yield lang, start, lines
        lang = None
    elif lang is not None:
      lines.append(line)


def logical_lines(start, lines):
  """(line number, text) with backslash continuations joined."""
  joined, first = "", None
  for number, line in enumerate(lines, start):
    first = number if first is None else first
    if line.rstrip().endswith("\\"):
      joined += line.rstrip()[:-1] + " "
      continue
    yield first, joined + line
    joined, first = "", None


def shell_lines(page):
  for lang, start, lines in fenced_blocks(page):
    if lang in SHELL_BLOCKS:
      for number, text in logical_lines(start, lines):
        yield f"{page.relative_to(REPO)}:{number}", text.strip().removeprefix("$ ")


def rljax_argv(tokens):
  """The arguments after `rljax` or `python -m rljax`, else None."""
  if tokens[:1] == ["rljax"]:
    return tokens[1:]
  if len(tokens) >= 3 and re.fullmatch(r"python3?", tokens[0]) and tokens[1:3] == ["-m", "rljax"]:
    return tokens[3:]
  return None


def all_commands():
  found = []
  for page in PAGES:
    for where, text in shell_lines(page):
      argv = rljax_argv(shlex.split(text, comments=True)) if text else None
      if argv is not None:
        needs = NEEDS.search(text)
        found.append(Command(where, text, argv, needs.group(1).strip() if needs else ""))
  return found


def shown_files():
  """{name: text} of the Python blocks whose first line is `# NAME.py` or `# NAME.py: ...`."""
  files = {}
  for page in PAGES:
    for lang, _, lines in fenced_blocks(page):
      name = re.match(r"#\s*([\w/]+\.py)\b", lines[0]) if lang == "python" and lines else None
      if name:
        files[name.group(1)] = "\n".join(lines) + "\n"
  return files


COMMANDS = all_commands()


def _data_rows(n=120):
  return [{"prompt": f"Q:{a}+{b}\n", "answer": str(a + b),
           "solution": f"<answer>{a + b}</answer>"} for a in range(12) for b in range(n // 12)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A scratch directory with everything the commands name; sys.path and the modules the
  commands import are restored afterwards."""
  root = tmp_path_factory.mktemp("docs_commands")
  for name in ("experiments", "examples"):
    (root / name).symlink_to(REPO / name, target_is_directory=True)
  for name, text in shown_files().items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _data_rows()))
  (root / "my_pkg").mkdir()
  (root / "my_pkg" / "__init__.py").write_text("")
  (root / "my_pkg" / "rewards.py").write_text(
      "def cites_source(prompt, completion, answer):\n"
      "  return float('source:' in completion)\n")
  saved = load_config(str(REPO / "experiments/grpo.py")).to_json_best_effort()
  (root / "runs" / "grpo").mkdir(parents=True)
  (root / "runs" / "grpo" / "config.json").write_text(saved)
  path, modules = list(sys.path), set(sys.modules)
  yield root
  sys.path[:] = path
  for name in set(sys.modules) - modules:
    if name == "my_pkg" or name.startswith(("my_pkg.", "rljax_user_", "rljax_cli_")):
      del sys.modules[name]


def test_the_pages_hold_the_commands_this_test_checks():
  where = {c.where.split(":")[0] for c in COMMANDS}
  assert {"README.md", "docs/multiturn.md", "docs/lora.md", "docs/results.md"} <= where
  assert {c.argv[0] for c in COMMANDS} == {"train", "ablate", "eval", "plan", "reward-model"}
  assert len(COMMANDS) >= 15
  assert {"my_ablation.py", "my_rewards.py", "my_env.py"} <= set(shown_files())


def test_no_command_hides_where_this_test_cannot_see_it():
  """An `rljax train|ablate|eval|plan` in a shell block must start its line (not follow `&&`,
  `;` or a loop), or this test would skip it."""
  hidden = [(where, text) for page in PAGES for where, text in shell_lines(page)
            if SUBCOMMAND.search(text) and not text.startswith(("rljax ", "python -m rljax",
                                                                 "python3 -m rljax", "#"))]
  assert not hidden


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_works_as_written(command, workdir, monkeypatch, capsys):
  monkeypatch.chdir(workdir)
  sub, args = command.argv[0], command.argv[1:]
  if command.needs:   # validated offline, then skipped for what it needs
    {"train": cli.train_config, "ablate": cli.ablate_configs, "eval": cli.eval_config,
     "plan": cli.plan_config, "reward-model": parse_reward_model_args}[sub](args)
    pytest.skip(f"{command.where}: validated only; needs {command.needs}")
  try:
    cli.main(command.argv + ([] if "--check" in args else ["--check"]))
  except SystemExit as e:
    pytest.fail(f"{command.where}: `{command.text}` exited with {e.code}:\n"
                f"{capsys.readouterr().err}")
  out = capsys.readouterr().out
  assert "nothing was" in out, out
