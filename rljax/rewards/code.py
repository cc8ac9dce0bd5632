"""Test-case pass rate for code answers, executed in a sandboxed subprocess.

The reward of a program is the fraction of its test statements that pass (a pass rate,
not all-or-nothing).

Containment layers of `run_tests` (each test in tests/test_rewards_code.py):
- a fresh `python -I` process per program, its own session, killed as a process group
  (SIGKILL) at the wall-clock deadline; RLIMIT_CPU for busy loops;
- RLIMIT_AS (memory), RLIMIT_FSIZE (file and output size), no core files;
- a temporary working directory, deleted afterwards; an audit hook (PEP 578) refuses
  process creation, sockets and file writes outside that directory;
- when available, a new network namespace (`unshare -n` as root, `unshare -rn` otherwise:
  no interface but a down loopback), and, as root when `nobody` can read the Python
  installation, the program runs as user `nobody` with RLIMIT_NPROC = 0 (fork then fails
  in the kernel, not only in Python; otherwise fork is refused by the audit hook only).
Note: this contains accidents and reward-hacking shortcuts of a policy under training; it
is not a security boundary against a determined adversary (Python code can reach its own
interpreter's frames). Use a container or gVisor for hostile code.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_code_runner.py")
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
NOBODY_UID = 65534


class CodeResult(NamedTuple):
  """passed/total test statements; status "ok" | "timeout" | "crashed"; tail of stderr."""
  passed: int
  total: int
  status: str
  stderr: str

  @property
  def pass_rate(self) -> float:
    return self.passed / self.total if self.total else 0.0


@functools.lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
  """`unshare` arguments that give the child an empty network namespace, if permitted."""
  exe = shutil.which("unshare")
  if exe is None:
    return ()
  for args in ((exe, "-n"), (exe, "-rn")) if os.geteuid() == 0 else ((exe, "-rn"),):
    try:
      if subprocess.run([*args, "true"], capture_output=True, timeout=10).returncode == 0:
        return args
    except (OSError, subprocess.TimeoutExpired):
      pass
  return ()


@functools.lru_cache(maxsize=1)
def _drop_uid() -> int:
  """`nobody` when running as root and `nobody` can read the interpreter's stdlib, else -1."""
  if os.geteuid() != 0:
    return -1
  import stat

  for leaf in (os.path.dirname(os.__file__), os.path.realpath(sys.executable)):
    path = leaf
    while True:
      mode = os.stat(path).st_mode
      need = stat.S_IXOTH | (stat.S_IROTH if path == leaf else 0)
      if mode & need != need:
        return -1
      if path == os.path.dirname(path):
        break
      path = os.path.dirname(path)
  return NOBODY_UID


def extract_code(completion: str) -> str:
  """The last ```python fenced block of a completion, else the whole text."""
  blocks = _CODE_BLOCK.findall(completion)
  return blocks[-1] if blocks else completion


def run_tests(code: str, tests: list[str], *, timeout: float = 5.0, memory_mb: int = 512,
              file_mb: int = 8, isolate_network: bool = True) -> CodeResult:
  """Runs `code`, then each test statement (e.g. `"assert add(1, 2) == 3"`), sandboxed.

  Args:
    code: the program.
    tests: Python statements; a test passes iff it runs without raising.
    timeout: wall-clock seconds for the whole run (CPU limit: the same, rounded up).
    memory_mb: address-space limit.
    file_mb: largest file (and output) the program may write.
    isolate_network: run in a new network namespace when `unshare` allows it.
  Returns:
    `CodeResult`; tests not reached before a timeout or crash count as failed.
  """
  nonce = secrets.token_hex(8)
  work = tempfile.mkdtemp(prefix="rljax_sandbox_")
  logs = tempfile.mkdtemp(prefix="rljax_sandbox_logs_")
  uid = _drop_uid()
  if uid >= 0:
    os.chown(work, uid, uid)
  cmd = [*(_netns_prefix() if isolate_network else ()), sys.executable, "-I", _RUNNER, work,
         str(int(timeout) + 1), str(memory_mb << 20), str(file_mb << 20), str(uid)]
  env = {"PATH": "/usr/bin:/bin", "RLJAX_SANDBOX_NONCE": nonce, "PYTHONHASHSEED": "0"}
  out_path, err_path = os.path.join(logs, "out"), os.path.join(logs, "err")
  status = "ok"
  try:
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work,
                              env=env, start_new_session=True, close_fds=True)
      try:
        proc.communicate(json.dumps({"code": code, "tests": list(tests)}).encode(),
                         timeout=timeout)
      except subprocess.TimeoutExpired:
        status = "timeout"
      finally:
        _kill_group(proc)
    if status == "ok" and proc.returncode != 0:
      status = "crashed"
    passed, seen = _read_results(out_path, nonce)
    if status == "ok" and seen < len(tests):
      status = "crashed"
    with open(err_path, "rb") as f:
      f.seek(max(0, os.path.getsize(err_path) - 2000))
      tail = f.read().decode("utf-8", "replace")
    return CodeResult(passed, len(tests), status, tail)
  finally:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session
  except (ProcessLookupError, PermissionError):
    pass
  deadline = time.monotonic() + 5
  while proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.01)


def _read_results(path: str, nonce: str) -> tuple[int, int]:
  passed = seen = 0
  with open(path, "rb") as f:
    for raw in f.read(1 << 22).decode("utf-8", "replace").splitlines():
      if raw.startswith(nonce + " "):
        try:
          r = json.loads(raw[len(nonce) + 1:])
        except json.JSONDecodeError:
          continue
        seen += 1
        passed += bool(r.get("ok"))
  return passed, seen


def code_pass_rate(prompt: str, completion: str, answer: str) -> float:
  """A `task.reward_fns` entry: the pass rate of the completion's code on the tests in `answer`.

  Use as `task.reward_fns = ["rljax.rewards.code:code_pass_rate"]` with a task whose answer
  is a JSON list of test statements (e.g. a JSONL task's `answer` column); the code is the
  completion's last fenced block (`extract_code`), run by `run_tests` with its defaults.
  """
  return run_tests(extract_code(completion), json.loads(answer)).pass_rate
