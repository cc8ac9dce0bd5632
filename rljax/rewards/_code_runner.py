"""Runs untrusted code + test statements inside the sandbox process (started by code.py).

argv: workdir, cpu_seconds, memory_bytes, file_bytes, drop_uid (-1: keep). The program
and the tests come as JSON on stdin; each test's outcome is printed as one line
`<nonce> {"i": k, "ok": bool}` on stdout, flushed, so a later hang cannot hide earlier
passes. The nonce comes from the environment and is removed before user code runs.
"""

import json
import os
import resource
import sys


def _limits(cpu, mem, fsize):
  resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
  resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
  resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _audit_hook(workdir):
  """Blocks process creation, sockets, and file writes outside `workdir`."""
  root = os.path.realpath(workdir) + os.sep
  blocked = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
             "subprocess.Popen", "os.kill", "os.killpg", "socket.__new__", "socket.connect",
             "socket.bind", "socket.getaddrinfo", "ctypes.dlopen", "os.chdir", "sys.addaudithook")
  write_events = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                  "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "os.utime")

  def inside(path):
    try:
      p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else workdir)
    except Exception:  # noqa: BLE001
      return False
    return (p + os.sep).startswith(root)

  def hook(event, args):
    if event in blocked:
      raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) >= 2:
      path, mode = args[0], args[1]
      flags = args[2] if len(args) > 2 else 0
      writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
          (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
      if writes and not isinstance(path, int) and not inside(path):
        raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
    elif event in write_events and args and not inside(args[0]):
      raise PermissionError(f"sandbox: {event} on {args[0]!r} outside the working directory")

  sys.addaudithook(hook)


def main():
  workdir, cpu, mem, fsize, uid = sys.argv[1], *map(int, sys.argv[2:6])
  job = json.loads(sys.stdin.read())
  nonce = os.environ.pop("RLJAX_SANDBOX_NONCE")
  os.chdir(workdir)
  _limits(cpu, mem, fsize)
  if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
  out = sys.stdout
  _audit_hook(workdir)
  g = {"__name__": "__main__"}
  try:
    exec(compile(job["code"], "solution.py", "exec"), g)
    ok_code = True
  except BaseException:  # noqa: BLE001  (SystemExit, errors of user code)
    ok_code = False
  for i, test in enumerate(job["tests"]):
    ok = False
    if ok_code:
      try:
        exec(compile(test, f"test_{i}", "exec"), g)
        ok = True
      except BaseException:  # noqa: BLE001
        ok = False
    out.write(f"{nonce} {json.dumps({'i': i, 'ok': ok})}\n")
    out.flush()


if __name__ == "__main__":
  main()
