"""Measured choice (opt-in): the selector's close candidates timed on a matrix's first product.

The simulation (``selector``) ranks the paths, but its costs carry errors: largest on small
power-law graphs, where "rows", "csr" and the Tensor-Core kernels are close; on a host faster or
slower than the one it was fitted on; with kernels that changed since the fit. Where it missed,
the fastest path had been predicted within ``MARGIN`` of the choice.

Off by default: with rows pieces sized per matrix the prediction alone picks close to the fastest
path on nearly every (graph, N) pair of the SpMM suite, while a trial costs several products'
time (BENCHMARKS.md, the selector benchmark). ``set_enabled(True)`` turns it on (a host or GPU
unlike the calibration's, kernels changed since the fit).

When on, like ``torch.backends.cudnn.benchmark``, the first product of a matrix at an N bucket runs
every candidate predicted within ``MARGIN`` of the choice on the caller's operands (``Trial``):
``UNTIMED_CALLS`` calls each (lazy kernel loading, cold caches), then ``TIMED_ROUNDS`` rounds of
one sample per candidate, a sample being back-to-back calls timed with CUDA events, as many as
last about ``SAMPLE_US`` by the prediction, at least ``CALLS_PER_SAMPLE`` (``sample_calls``). The
host side counts, since that is what a call on a small graph costs. One synchronisation at the end
reads the events; the bucket settles on the candidate with the lowest median, or on "csr"
(torch.sparse) within ``CSR_TIE`` of it, since cuSPARSE is what the user would run without us.
Every candidate computes the same product, and the product returns the last one computed.

Timing the calls back to back within one product, rather than one call per product over the
caller's next products, keeps the caller's own work out of the samples: on small graphs the GPU
waits for the host, and a sample spread over the caller's loop held its other work and its
synchronisations too, which read torch.sparse (the heaviest path on the host) high and settled on
slower paths.

Not measured, the predicted choice runs from the first call: unless ``set_enabled(True)``, with
``torch.use_deterministic_algorithms(True)`` (the path would depend on timings), while a CUDA graph
is being captured, inside ``torch.compile``, and when the prediction leaves no close candidate.
"""
from __future__ import annotations

import statistics

import torch

MARGIN = 0.3
UNTIMED_CALLS = 2
TIMED_ROUNDS = 5
CALLS_PER_SAMPLE = 4
SAMPLE_US = 400.0
MAX_CALLS_PER_SAMPLE = 32
CSR_TIE = 0.05

_enabled = False


def set_enabled(enabled: bool) -> None:
    """Turn measured choices on or off (the default), for every matrix from the next choice on:
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
    """The path to keep from a trial's medians: the fastest, or "csr" within ``CSR_TIE`` of it."""
    best = min(measured_us, key=measured_us.get)
    if "csr" in measured_us and measured_us["csr"] <= (1.0 + CSR_TIE) * measured_us[best]:
        return "csr"
    return best


def sample_calls(predicted_us: float) -> int:
    """Calls in a sample of a path predicted to take ``predicted_us`` a call: enough for about
    ``SAMPLE_US``, at least ``CALLS_PER_SAMPLE``. A call on a small graph costs tens of
    microseconds of host time, and one hiccup of the host moved a sample of 3 calls by up to 50%,
    more than the paths differ by."""
    return int(min(MAX_CALLS_PER_SAMPLE, max(CALLS_PER_SAMPLE, -(-SAMPLE_US // max(predicted_us, 1.0)))))


class EventTimer:
    """CUDA events on the current stream around one sample."""

    def __init__(self):
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record()

    def stop(self) -> None:
        self._end.record()

    def wait(self) -> None:
        self._end.synchronize()

    def elapsed_us(self) -> float:
        return 1e3 * self._start.elapsed_time(self._end)


class Trial:
    """The measurement of ``paths`` for one (N bucket, dtype, device) ``key`` of a matrix, run
    within one product: ``calls[i]`` calls of ``paths[i]`` per sample (``CALLS_PER_SAMPLE`` if
    not given), the samples of the paths interleaved round by round, so that a drift of the
    machine falls on all of them alike."""

    def __init__(self, paths: tuple[str, ...], calls: tuple[int, ...] | None = None, key=None, timer=EventTimer):
        self.paths = paths
        self.calls = calls or (CALLS_PER_SAMPLE,) * len(paths)
        self.key = key
        self._timer = timer

    def run(self, product):
        """(median microseconds per call of each path, the last output) of ``product(path)``,
        which computes the caller's product on ``path``."""
        for path in self.paths:
            for _ in range(UNTIMED_CALLS):
                output = product(path)
        samples = {path: [] for path in self.paths}
        for _ in range(TIMED_ROUNDS):
            for path, calls in zip(self.paths, self.calls):
                timer = self._timer()
                timer.start()
                for _ in range(calls):
                    output = product(path)
                timer.stop()
                samples[path].append((timer, calls))
        timer.wait()  # the last event: every sample before it is done too
        measured = {path: statistics.median(t.elapsed_us() / calls for t, calls in timed) for path, timed in samples.items()}
        return measured, output
