"""Subprocess worker for `rljax.rewards.math`: runs math-verify (sympy) on JSON lines.

Started as `python _math_worker.py` (by path, so it never imports rljax or JAX). Each
stdin line is a request `{"op": "verify", "gold": str, "pred": str}` or
`{"op": "value", "s": str}`; each stdout line is `{"ok": bool, "result": ...}`. math-verify's
own signal-based timeouts work here because this is the main thread of its own process; the
parent additionally kills the process on a hard deadline (C-level hangs in sympy/GMP).
"""

import json
import logging
import re
import resource
import sys

_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")


def _parse(s, timeout):
  from math_verify import parse

  if "$" in s or "\\(" in s or "\\[" in s or _WORD.search(s):
    return parse(s, parsing_timeout=timeout)
  return parse(f"${s}$", parsing_timeout=timeout)


def _verify(gold, pred, timeout):
  from math_verify import verify

  g, p = _parse(gold, timeout), _parse(pred, timeout)
  if not g or not p:
    return False
  return bool(verify(g, p, timeout_seconds=timeout))


def _value(s, timeout):
  """float value of an exact irrational real constant (pi, sqrt(2), ...), else None."""
  import sympy

  parsed = [x for x in _parse(s, timeout) if isinstance(x, sympy.Basic)]
  if not parsed:
    return None
  x = parsed[0]
  if not x.is_number or x.is_Rational or x.atoms(sympy.Float) or x.free_symbols:
    return None
  v = complex(x.evalf(30))
  return v.real if v.imag == 0 else None


def main():
  logging.disable(logging.CRITICAL)
  mem = int(float(sys.argv[1])) if len(sys.argv) > 1 else 4 << 30
  resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
  import math_verify  # noqa: F401  (import once, before the first request)

  for line in sys.stdin:
    try:
      req = json.loads(line)
      t = int(req.get("timeout", 2))
      if req["op"] == "verify":
        out = {"ok": True, "result": _verify(req["gold"], req["pred"], t)}
      else:
        out = {"ok": True, "result": _value(req["s"], t)}
    except BaseException as e:  # noqa: BLE001  (report, keep serving)
      out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  main()
