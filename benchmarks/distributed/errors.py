"""Errors in the benchmark's command: one line, printed once (by rank 0 under torchrun), and the
same nonzero exit code from every rank, instead of a traceback per rank under torchrun's report."""
from __future__ import annotations

import os
import sys

# The exit code of an error in the command.
USAGE_ERROR = 2


def fail(message: str):
    print_once(f"benchmarks.distributed: error: {message}")
    sys.exit(USAGE_ERROR)


def print_once(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
