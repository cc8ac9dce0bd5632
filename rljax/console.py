"""The `rljax` console script (and `python -m rljax`): glibc's huge-page tunable first
(`rljax.host_memory.exec_with_huge_pages`, which must run before JAX is imported), then the
command line of `rljax.cli`."""

from __future__ import annotations

from rljax.host_memory import exec_with_huge_pages


def main() -> None:
  """`rljax COMMAND ...` as the installed command runs it."""
  exec_with_huge_pages()
  # imports JAX: after the re-execution
  from rljax.cli import main as cli_main

  cli_main()
