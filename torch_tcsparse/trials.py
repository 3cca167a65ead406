"""Measured choice: the selector's close candidates timed on a matrix's first products.

The simulation (``selector``) ranks the paths, but its costs carry errors: 10-25% on small
power-law graphs, where "rows", "csr" and the Tensor-Core kernels are close; a host faster or
slower than the one it was fitted on; kernels that changed since the fit. On a fresh H200 run the
model alone picked a path within 5% of the fastest on 86% of (graph, N) pairs in float32 and once
ran 1.26x slower than cuSPARSE; every miss had the fastest path predicted within 30% of the choice.

So, like ``torch.backends.cudnn.benchmark`` but with no extra work, the first products of a matrix
at an N bucket run each candidate predicted within ``MARGIN`` of the choice in turn: one untimed
round (lazy kernel loading, cold caches), then ``TIMED_ROUNDS`` rounds, each a sample of every
candidate: back-to-back calls timed with CUDA events (``CudaTimer``), as many as last about
``SAMPLE_US`` by the prediction, at least ``CALLS_PER_SAMPLE`` (``sample_calls``). The host side
counts, since that is what a call on a small graph costs, but not the trial's own host time. The
events are read only once they have completed (``Event.query``), never with a synchronisation;
meanwhile the predicted choice runs. The bucket then settles on the candidate with the lowest
median, or on "csr" (torch.sparse) when its median is close to that (``fastest``): calls on small
graphs are bound by the host, where single timings differ by 5-15% from one call to the next, and
cuSPARSE is what the user would run without us. Every candidate computes the same product:
outputs differ only by rounding, and only during those first calls.

Not measured, the predicted choice runs from the first call: with
``torch.use_deterministic_algorithms(True)`` (the path would depend on timings), while a CUDA graph
is being captured, inside ``torch.compile``, when the prediction leaves no close candidate, and
after ``set_enabled(False)``.
"""
from __future__ import annotations

import statistics
import time

import torch

MARGIN = 0.3
UNTIMED_ROUNDS = 1
TIMED_ROUNDS = 5
CALLS_PER_SAMPLE = 4
SAMPLE_US = 400.0
MAX_CALLS_PER_SAMPLE = 32
CSR_TIE = 0.05
SMALL_CALL_CSR_TIE = 0.15
SMALL_CALL_US = 100.0

_enabled = True


def set_enabled(enabled: bool) -> None:
    """Turn measured choices on (the default) or off, for every matrix from the next choice on:
    off, a path is the simulation's prediction alone."""
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    return _enabled


def allowed(device: torch.device) -> bool:
    """Whether a choice on ``device`` may be measured now."""
    return (
        _enabled
        and device.type == "cuda"
        and not torch.are_deterministic_algorithms_enabled()
        and not torch.compiler.is_compiling()
        and not torch.cuda.is_current_stream_capturing()
    )


def shortlist(choice: str, costs_us: dict, candidates) -> tuple[str, ...]:
    """The predicted choice first, then every other candidate predicted within ``MARGIN`` of it."""
    limit = (1.0 + MARGIN) * costs_us[choice]
    return (choice,) + tuple(p for p in candidates if p != choice and costs_us[p] <= limit)


def fastest(measured_us: dict) -> str:
    """The path to keep from a trial's medians: the fastest, or "csr" within ``CSR_TIE`` of it,
    within ``SMALL_CALL_CSR_TIE`` where the fastest took under ``SMALL_CALL_US``. Small calls are
    bound by the host, and a host-bound sample's span holds the caller's time between the calls
    (its loop, its synchronisations) as well: torch.sparse, the heaviest path on the host, read
    10-20% above its back-to-back time there while our device-bound kernels read true (H200:
    snap_wiki-Vote and snap_ca-HepPh at N = 256)."""
    best = min(measured_us, key=measured_us.get)
    tie = SMALL_CALL_CSR_TIE if measured_us[best] < SMALL_CALL_US else CSR_TIE
    if "csr" in measured_us and measured_us["csr"] <= (1.0 + tie) * measured_us[best]:
        return "csr"
    return best


def per_call_us(span_ms: float, overhead_s: float, device_bound: bool, calls: int) -> float:
    """Microseconds per timed call of a sample: the events' span over the ``calls`` calls, less
    the host time the trial itself spent inside it (``overhead_s``) when the GPU kept up with the
    host. Bound by the host, the GPU waits out that time too, so it would count against the paths
    that cost the most on the host (torch.sparse, 45 us a call on one H200 host) and for none of
    the paths the GPU is slower on; bound by the GPU, the queue hides it."""
    span_us = 1e3 * span_ms
    if not device_bound:
        # The floor only guards against clocks that disagree: the overhead sits inside the span.
        span_us = max(span_us - 1e6 * overhead_s, 0.1 * span_us)
    return span_us / calls


class CudaTimer:
    """Events on the current stream around ``calls`` consecutive calls, a context manager entered
    once per call (``calls`` >= 3).

    The first call only leads in: the start event follows it, the end event the last call, and
    the span is divided by the ``calls - 1`` calls between. An event recorded before the first
    call would time from wherever the GPU stood: idle after a synchronisation, it counts the
    host time of that call too, which (in the benchmarks' groups of 8 products) fell on the same
    candidates in every round and cost one of them 10-20% on a small graph.

    Whether the GPU or the host set the pace: an event follows the last call but one, and when the
    last call has been issued the GPU either has passed it (it waited for the host) or not (work
    queued up). The host time the trial spends in the span (choosing, events: ``charge`` and this
    timer's own exits) is then taken out of host-bound samples (``per_call_us``)."""

    def __init__(self, calls: int = 3):
        if calls < 3:
            raise ValueError(f"a timer needs at least 3 calls (one leads in), got {calls}")
        self.calls = calls
        self._start = torch.cuda.Event(enable_timing=True)
        self._before_last = torch.cuda.Event()
        self._end = torch.cuda.Event(enable_timing=True)
        self._exited = 0
        self._overhead_s = 0.0
        self._device_bound = False
        self.failed = False

    def charge(self, seconds: float) -> None:
        """Host time the caller spent on the trial for the coming call."""
        if self._exited:  # inside the span
            self._overhead_s += seconds

    def __enter__(self) -> "CudaTimer":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        entered = time.perf_counter()
        if exc_type is not None:
            self.failed = True
            return
        self._exited += 1
        if self._exited == 1:
            self._start.record()
            return
        if self._exited == self.calls - 1:
            self._before_last.record()
        elif self._exited == self.calls:
            self._device_bound = not self._before_last.query()
            self._overhead_s += time.perf_counter() - entered
            self._end.record()
            return
        self._overhead_s += time.perf_counter() - entered

    def done(self) -> bool:
        return self.failed or (self._exited == self.calls and self._end.query())

    def elapsed_us(self) -> float:
        """Microseconds per call."""
        if self.failed:
            return float("inf")
        span_ms = self._start.elapsed_time(self._end)
        return per_call_us(span_ms, self._overhead_s, self._device_bound, self.calls - 1)


def sample_calls(predicted_us: float) -> int:
    """Calls in a sample of a path predicted to take ``predicted_us`` a call: enough for about
    ``SAMPLE_US``, at least ``CALLS_PER_SAMPLE``. A call on a small graph costs tens of
    microseconds of host time, and one hiccup of the host moved a sample of 3 timed calls by up
    to 50% (an H200 run: the trial's time over the benchmark's between 0.86 and 1.5 on one pair in
    five), more than the paths differ by."""
    return int(min(MAX_CALLS_PER_SAMPLE, max(CALLS_PER_SAMPLE, -(-SAMPLE_US // max(predicted_us, 1.0)))))


class Trial:
    """The calls that measure ``paths`` for one (matrix, N bucket, dtype, device): ``next`` gives
    the path of each call, with a timer to run it in or None; ``result`` gives the median
    microseconds per call of each path once every timed call has completed, else None. A sample
    is ``calls[i]`` calls of ``paths[i]`` back to back (``CALLS_PER_SAMPLE`` if not given): on a
    small graph that is the throughput of a loop of products, and the events' own cost is spread
    over them."""

    def __init__(self, paths: tuple[str, ...], calls: tuple[int, ...] | None = None, timer=None):
        self.paths = paths
        self._timer = timer or CudaTimer
        per_sample = dict(zip(paths, calls or (CALLS_PER_SAMPLE,) * len(paths)))
        # (path, calls in its sample) at the first call of each sample, None at the others.
        self._schedule = []
        for _ in range(UNTIMED_ROUNDS + TIMED_ROUNDS):
            for path in paths:
                self._schedule += [(path, per_sample[path])] + [(path, None)] * (per_sample[path] - 1)
        self._untimed = sum(per_sample.values()) * UNTIMED_ROUNDS
        self._calls = 0
        self._timers: dict[str, list] = {path: [] for path in paths}

    def next(self):
        """(path, timer or None) of the next call; the predicted choice untimed once the
        schedule has run out, while its last events complete."""
        if self._calls >= len(self._schedule):
            return self.paths[0], None
        path, sample_start = self._schedule[self._calls]
        timed = self._calls >= self._untimed
        self._calls += 1
        if not timed:
            return path, None
        if sample_start is not None:
            self._timers[path].append(self._timer(sample_start))
        return path, self._timers[path][-1]

    def result(self) -> dict | None:
        if self._calls < len(self._schedule):
            return None
        if not all(timer.done() for timers in self._timers.values() for timer in timers):
            return None
        return {path: statistics.median(t.elapsed_us() for t in timers) for path, timers in self._timers.items()}
