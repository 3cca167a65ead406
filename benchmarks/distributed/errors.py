"""Errors in the benchmark's command: one line, printed once (by rank 0 under torchrun), and a
nonzero exit from every rank, instead of a traceback per rank before torchrun's failure report."""
from __future__ import annotations

import os
import sys
import time

# The exit code of an error in the command.
USAGE_ERROR = 2
# How long the other ranks wait before exiting: torchrun stops every rank once one has failed,
# and rank 0 must have printed the line by then.
_GRACE_S = 2.0


def fail(message: str):
    print_once(f"benchmarks.distributed: error: {message}")
    if os.environ.get("RANK", "0") != "0":
        time.sleep(_GRACE_S)
    sys.exit(USAGE_ERROR)


def print_once(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
