"""Sandboxed test-case reward: correct code passes; loops, forks, writes, network contained."""

import json
import os

from rljax.data import Prompt
from rljax.rewards.code import extract_code, run_tests
from rljax.rewards.user import user_reward_terms

ADD = "def add(a, b):\n  return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]


def test_pass_rate_of_a_program():
  r = run_tests(ADD, TESTS)
  assert (r.passed, r.total, r.status) == (2, 3, "ok") and abs(r.pass_rate - 2 / 3) < 1e-9
  assert run_tests("raise ValueError('x')", TESTS).passed == 0
  [(name, reward, _)] = user_reward_terms(["rljax.rewards.code:code_pass_rate"])  # the config
  p = Prompt(id="c", text="write add", answer=json.dumps(TESTS), difficulty=1)
  assert name == "code_pass_rate"
  assert abs(reward(p, f"Here:\n```python\n{ADD}```\n") - 2 / 3) < 1e-9
  assert extract_code("no fence") == "no fence"


def test_infinite_loop_is_killed_and_earlier_passes_count():
  r = run_tests(ADD, TESTS[:1] + ["while True: pass"], timeout=1.0)   # never ends unless killed
  assert r.status == "timeout" and r.passed == 1
  r = run_tests("import time\ntime.sleep(100)", TESTS, timeout=1.0)  # idle hang: wall clock
  assert r.status == "timeout" and r.passed == 0


def test_fork_is_contained():
  code = ADD + "import os\npid = os.fork()\nif pid == 0:\n  import time; time.sleep(60)\n"
  r = run_tests(code, TESTS[:1])
  assert r.passed == 0  # program failed at fork
  probe = ("import subprocess\n"
           "def spawn():\n"
           "  try:\n    subprocess.run(['true']); return True\n"
           "  except Exception:\n    return False\n")
  assert run_tests(probe, ["assert spawn() is False"]).passed == 1


def test_write_outside_working_directory_is_refused(tmp_path):
  target = tmp_path / "pwned.txt"
  code = f"open({str(target)!r}, 'w').write('x')\n"
  assert run_tests(code, ["assert True"]).passed == 0
  assert not target.exists()
  inside = "open('scratch.txt', 'w').write('ok')\nok = open('scratch.txt').read() == 'ok'\n"
  assert run_tests(inside, ["assert ok"]).passed == 1  # its own temp dir is writable
  big = "open('big', 'w').write('x' * (64 << 20))\n"  # RLIMIT_FSIZE: 8 MB by default
  assert run_tests(big, ["assert True"]).passed == 0


def test_network_is_blocked():
  probe = ("import socket\n"
           "def net():\n"
           "  try:\n"
           "    s = socket.create_connection(('1.1.1.1', 53), timeout=1); s.close(); return True\n"
           "  except Exception:\n    return False\n")
  assert run_tests(probe, ["assert net() is False"]).passed == 1


def test_memory_limit():
  r = run_tests("x = bytearray(2 << 30)\n", ["assert True"], memory_mb=256)
  assert r.passed == 0
  assert os.path.exists("/tmp")  # sanity: the sandbox did not touch the host
