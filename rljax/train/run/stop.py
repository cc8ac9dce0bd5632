"""Ctrl-C / SIGTERM during a run: finish the current iteration, checkpoint, then stop."""

from __future__ import annotations

import signal


class StopFlag:
  """`with StopFlag() as stop:` ... `stop.raised` is True once SIGINT or SIGTERM arrived."""

  def __init__(self):
    self.raised = False
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not in the main thread
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    print(f"\n[rljax] signal {signum}: finishing this iteration, then checkpointing")
    self.raised = True

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
