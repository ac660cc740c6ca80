"""The one convention of every `python -m` entry point (pipeline, model, eval, infra).

A command's `main(argv)` does the work; `run_cli(main)` is its shell face:

* a bad flag, path or input (`UsageError`, or a missing file) is one line `error: ...` naming
  it, exit status 2; commands check these before any work starts;
* data lost while the job ran (`DataLossError`: a run that finished but lost more of its
  input than allowed) is one line `error: ...`, exit status 1, after the outputs and stats
  that explain it were written;
* anything else is a bug and keeps its traceback.

Flags are spelt `--with-dashes` except the pipeline's own, which stay `--with_underscores` like
the Beam pipeline options they are mixed with.
"""
from __future__ import annotations

import sys
from typing import Callable


class UsageError(ValueError):
    """A flag, path or input the command cannot run with; the message names it."""


class DataLossError(RuntimeError):
    """The job ran but lost more of its input than allowed; its outputs stay unpublished."""


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
    """Runs `main` on the command line's arguments; returns the exit status (see module docstring)."""
    try:
        main(sys.argv[1:] if argv is None else argv)
    except (UsageError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except DataLossError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
