"""List scheduling of thread blocks on the GPU's slots: exact for a few jobs per slot, a fluid
estimate beyond (the simulation cost the selector's docstring describes)."""
from __future__ import annotations

import heapq

import numpy as np

EXACT_JOBS_PER_SLOT = 4


def list_schedule_exact(costs, slots: int) -> float:
    """Makespan of list scheduling with a heap: each job, in order, to the slot that frees first.
    The reference the fast simulator is tested against."""
    free = [0.0] * slots
    for cost in np.asarray(costs, dtype=np.float64).tolist():
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def list_schedule_makespan(costs, slots: int) -> float:
    """Makespan of list scheduling ``costs`` (in launch order) on ``slots`` identical slots."""
    costs = np.asarray(costs, dtype=np.float64)
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    if costs.size == 0:
        return 0.0
    if costs.size <= slots:
        return float(costs.max())
    if costs.size <= EXACT_JOBS_PER_SLOT * slots:
        return batched_schedule(np.zeros(slots), costs)
    return fluid_schedule(costs, slots)


def batched_schedule(free: np.ndarray, costs: np.ndarray) -> float:
    """Exact list scheduling from slot free times ``free``, many jobs per numpy step.

    With the slots sorted by free time, job j of a batch goes to the j-th slot as long as none of
    the slots taken by jobs 0..j-1 of the batch frees before it; the batch ends at the first job
    for which that fails (so every step places at least one job)."""
    free = np.sort(free)
    slots, start = free.size, 0
    while start < costs.size:
        size = min(slots, costs.size - start)
        ends = free[:size] + costs[start : start + size]
        fits = np.minimum.accumulate(ends[:-1]) >= free[1:size]
        placed = size if fits.all() else int(np.argmin(fits)) + 1
        free[:placed] = ends[:placed]
        free.sort()
        start += placed
    return float(free[-1])


def fluid_schedule(costs: np.ndarray, slots: int, copies: int = 1, before: np.ndarray | None = None) -> float:
    """Many jobs per slot: each job's start estimated in O(1), the whole in a few numpy passes;
    every cost stands for ``copies`` consecutive jobs (a window's column slices).

    The first ``slots`` jobs start at once. A later job starts when a slot frees: by then the
    work before it, ``P``, is done except what the running jobs have left, about half a job each
    (the mean residual of desynchronized jobs), so it starts near ``P / slots - mean / 2``; the
    makespan is the latest end (of each cost's last copy), at least the work spread evenly.
    Against exact list scheduling (``tests/test_selector.py``): within 5% on random costs beyond
    ``EXACT_JOBS_PER_SLOT`` jobs per slot. Equal costs keep the slots in lockstep, with nothing
    left running when a wave ends: the estimate is then up to half a job high (10% at 5 jobs per
    slot, 2.5% at 20). ``before``: the exclusive prefix sums of ``costs``, when known."""
    if before is None:
        before = np.cumsum(costs) - costs
    total = (float(before[-1]) + float(costs[-1])) * copies
    last_copy_before = before * copies + costs * (copies - 1)
    start = np.maximum(0.0, last_copy_before / slots - float(costs.mean()) / 2)
    start[: -(-slots // copies)] = 0.0  # the costs whose copies all fit in the first wave
    return max(float((start + costs).max()), total / slots)
