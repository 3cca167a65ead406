"""Where the run on torchrun's ranks has got to: one line per finished stage, printed by rank 0
as soon as every rank has finished it, so that a run that stops shows the last stage all ranks
passed; and a line from a rank that fails, printed by that rank at once.

    [22:14:05 +93.2s] rmat26: partitioned | GB now/peak per rank: 8.1/30.2 8.3/9.0 8.0/8.8 8.2/8.9

The memory is each rank's allocated and peak device memory (since the last reset of the peak;
nothing on the CPU). Every rank calls a ``Progress`` at the same points: it gathers the ranks'
memory, a collective of a few bytes.
"""
from __future__ import annotations

import sys
import time
import traceback

import torch
import torch.distributed as dist


def clock() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


class Progress:
    """``progress(stage)`` after each stage (a collective); ``progress.stage`` names the last one
    every rank passed, for the report of a failure."""

    def __init__(self, device: torch.device, rank: int, world_size: int):
        self.device, self.rank, self.world_size = device, rank, world_size
        self.start = time.perf_counter()
        self.graph = ""
        self.stage = "start"

    def __call__(self, stage: str) -> None:
        mine = memory_gb(self.device)
        gathered = [mine] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(gathered, mine)
        self.stage = stage
        if self.rank == 0:
            print(format_line(self.elapsed(), self.graph, stage, gathered), flush=True)

    def epochs(self, label: str):
        """The ``progress`` of ``training.epochs`` for one run of epochs, its lines led by ``label``."""
        return lambda text: self(f"{label}: {text}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def report_failure(self, error: BaseException) -> None:
        """This rank's failure, printed by this rank at once (its peers may be waiting for it in
        a collective that never completes), with the traceback."""
        print(f"[{clock()} +{self.elapsed():.1f}s] rank {self.rank} failed after {self.graph}: {self.stage}: "
              f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        traceback.print_exception(error, file=sys.stderr)
        sys.stderr.flush()


def memory_gb(device: torch.device) -> tuple[float, float] | None:
    """(allocated, peak) GB on a GPU; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device) / 2**30, torch.cuda.max_memory_allocated(device) / 2**30


def format_line(elapsed: float, graph: str, stage: str, memory: list) -> str:
    where = f"{graph}: {stage}" if graph else stage
    line = f"[{clock()} +{elapsed:.1f}s] {where}"
    if any(m is not None for m in memory):
        line += " | GB now/peak per rank: " + " ".join("-" if m is None else f"{m[0]:.1f}/{m[1]:.1f}" for m in memory)
    return line
