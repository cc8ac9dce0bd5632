"""Client of the math-verify worker process: one persistent subprocess, hard deadlines.

Why a subprocess: math-verify's timeout uses `signal.alarm`, which only works in the main
thread (the trainer may score from a thread pool) and cannot interrupt a C-level sympy or
GMP computation such as `2^{2^{30}}`. The worker is started by path with
`subprocess.Popen` (fork+exec, safe from a process that has started JAX threads) in
isolated mode (`-I`: its own directory, which holds `math.py`, must not shadow the
standard library), under
an address-space limit, and is killed and restarted when a call misses its deadline.
Calls are serialised by a lock, so the client is thread-safe.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")
MEMORY_LIMIT_BYTES = 4 << 30

STATS = {"calls": 0, "timeouts": 0, "errors": 0, "restarts": 0}


class _Worker:
  def __init__(self):
    self.proc = None
    self.buf = b""
    self.lock = threading.Lock()

  def _start(self):
    self.proc = subprocess.Popen(
      [sys.executable, "-I", "-u", _WORKER, str(MEMORY_LIMIT_BYTES)], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
    self.buf = b""
    STATS["restarts"] += 1

  def close(self):
    if self.proc is not None:
      try:
        self.proc.kill()
        self.proc.wait(timeout=5)
      except (OSError, subprocess.TimeoutExpired):
        pass
      self.proc = None

  def _readline(self, deadline: float) -> bytes | None:
    fd = self.proc.stdout.fileno()
    while b"\n" not in self.buf:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        return None
      chunk = os.read(fd, 65536)
      if not chunk:
        return None
      self.buf += chunk
    line, self.buf = self.buf.split(b"\n", 1)
    return line

  def call(self, request: dict, timeout: float, startup_timeout: float = 60.0):
    with self.lock:
      STATS["calls"] += 1
      fresh = self.proc is None or self.proc.poll() is not None
      if fresh:
        self._start()
      request = dict(request, timeout=max(1, int(timeout)))
      # A fresh worker imports sympy first; that time is not charged to the request.
      deadline = time.monotonic() + timeout + (startup_timeout if fresh else 0.0)
      try:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(deadline)
      except OSError:
        line = None
      if line is None:
        STATS["timeouts"] += 1
        self.close()
        return None
      out = json.loads(line)
      if not out.get("ok"):
        STATS["errors"] += 1
        return None
      return out["result"]


_worker = _Worker()
atexit.register(_worker.close)


def worker_call(request: dict, *, timeout: float):
  """Sends one request to the worker; None on timeout (worker killed), error or crash."""
  return _worker.call(request, timeout)


