"""Measured choices (torch_tcsparse.trials): the shortlist, the schedule of a trial, and how a
SelectionCache settles on the fastest candidate. CPU only, with fake timers; a trial on CUDA
events runs in tests/gpu/test_trials.py."""
import statistics

import pytest
import torch

from torch_tcsparse import selector, trials
from torch_tcsparse.formats.inputs import from_coo
from torch_tcsparse.formats.metcf import build_metcf
from torch_tcsparse.selector import CHOICES, SelectionCache

CUDA = torch.device("cuda", 0)


class FakeTimer:
    """A timer whose elapsed time per call the test sets; done once set."""

    def __init__(self, calls=1):
        self.calls = calls
        self.us = None

    def charge(self, seconds):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def done(self):
        return self.us is not None

    def elapsed_us(self):
        return self.us


def layout():
    g = torch.Generator().manual_seed(0)
    row, col = torch.randint(0, 300, (2000,), generator=g), torch.randint(0, 300, (2000,), generator=g)
    return build_metcf(from_coo(row, col, None, (300, 300), None), 16)[0]


def test_shortlist_keeps_the_choice_first_and_the_close_candidates():
    costs = {"base": 10.0, "balanced": 12.9, "csr": 13.1, "rows": 11.0}
    assert trials.shortlist("base", costs, CHOICES) == ("base", "balanced", "rows")
    assert trials.shortlist("rows", costs, ("rows", "csr")) == ("rows", "csr")  # csr 19% above rows
    assert trials.shortlist("csr", costs, CHOICES) == ("csr", "base", "balanced", "rows")


def test_trial_runs_an_untimed_round_then_timed_rounds_in_turn():
    trial = trials.Trial(("rows", "csr"), timer=FakeTimer)
    rounds, per_sample = trials.UNTIMED_ROUNDS + trials.TIMED_ROUNDS, trials.CALLS_PER_SAMPLE
    calls = [trial.next() for _ in range(2 * rounds * per_sample)]
    assert [path for path, _ in calls] == (["rows"] * per_sample + ["csr"] * per_sample) * rounds
    untimed = 2 * trials.UNTIMED_ROUNDS * per_sample
    assert all(timer is None for _, timer in calls[:untimed])
    samples = calls[untimed::per_sample]  # the first call of each timed sample
    for start, (path, timer) in zip(range(untimed, len(calls), per_sample), samples):
        assert isinstance(timer, FakeTimer) and timer.calls == per_sample
        assert all(other is timer for _, other in calls[start : start + per_sample])  # one timer per sample
    assert trial.result() is None  # events not completed
    for i, (path, timer) in enumerate(samples):
        timer.us = (10.0 if path == "rows" else 20.0) + i
    assert trial.next() == ("rows", None)  # schedule done: the predicted choice while waiting
    rows_us = [10.0 + i for i in range(0, 2 * trials.TIMED_ROUNDS, 2)]
    csr_us = [20.0 + i for i in range(1, 2 * trials.TIMED_ROUNDS, 2)]
    assert trial.result() == {"rows": statistics.median(rows_us), "csr": statistics.median(csr_us)}


def test_samples_last_about_sample_us_by_the_prediction():
    assert trials.sample_calls(trials.SAMPLE_US / 10) == 10
    assert trials.sample_calls(trials.SAMPLE_US) == trials.CALLS_PER_SAMPLE
    assert trials.sample_calls(0.0) == trials.MAX_CALLS_PER_SAMPLE


def test_each_path_samples_its_own_number_of_calls():
    trial = trials.Trial(("rows", "csr"), calls=(3, 5), timer=FakeTimer)
    rounds = trials.UNTIMED_ROUNDS + trials.TIMED_ROUNDS
    calls = [trial.next() for _ in range(8 * rounds)]
    assert [path for path, _ in calls] == (["rows"] * 3 + ["csr"] * 5) * rounds
    timed = calls[8 * trials.UNTIMED_ROUNDS :]
    assert [timer.calls for path, timer in timed[::8]] == [3] * trials.TIMED_ROUNDS
    assert [timer.calls for path, timer in timed[3::8]] == [5] * trials.TIMED_ROUNDS


def test_fastest_gives_a_near_tie_to_csr_and_a_wider_one_on_small_calls():
    assert trials.fastest({"rows": 400.0, "base": 450.0}) == "rows"
    assert trials.fastest({"rows": 400.0, "csr": 419.0}) == "csr"
    assert trials.fastest({"rows": 400.0, "csr": 421.0}) == "rows"
    assert trials.fastest({"rows": 40.0, "csr": 45.9}) == "csr"
    assert trials.fastest({"rows": 40.0, "csr": 46.1}) == "rows"


def test_a_timer_needs_a_call_to_lead_in_and_one_before_the_last():
    with pytest.raises(ValueError, match="at least 3 calls"):
        trials.CudaTimer(2)


def test_the_trials_own_host_time_leaves_host_bound_samples_only():
    # 3 timed calls in a 120 us span, 30 us of it the trial's own host time.
    assert trials.per_call_us(0.120, 30e-6, device_bound=False, calls=3) == pytest.approx(30.0)
    assert trials.per_call_us(0.120, 30e-6, device_bound=True, calls=3) == pytest.approx(40.0)
    # Clocks that disagree never make a sample free.
    assert trials.per_call_us(0.120, 1e-3, device_bound=False, calls=3) == pytest.approx(4.0)


def test_a_failed_call_times_as_infinite():
    timer = trials.CudaTimer.__new__(trials.CudaTimer)
    timer.failed = True
    assert timer.done() and timer.elapsed_us() == float("inf")


@pytest.fixture
def measured_cache(monkeypatch):
    """A SelectionCache that believes it runs on CUDA with every path available, and predicts
    base at 10 us with balanced and rows close, csr far."""
    costs = {"base": 10.0, "balanced": 12.0, "csr": 30.0, "rows": 11.0}
    monkeypatch.setattr(selector, "_candidates", lambda dtype, device, shape: CHOICES)
    monkeypatch.setattr(selector, "predicted_choice", lambda *args: ("base", costs))
    monkeypatch.setattr(trials, "allowed", lambda device: True)
    monkeypatch.setattr(trials, "CudaTimer", FakeTimer)
    monkeypatch.setattr(trials, "SAMPLE_US", 0.0)  # samples of CALLS_PER_SAMPLE calls
    return SelectionCache(), layout()


def test_cache_measures_the_shortlist_then_settles_on_the_fastest(measured_cache, monkeypatch):
    cache, lay = measured_cache
    monkeypatch.setattr(selector, "explain_shape", lambda *args: selector.Explanation(
        "base", "predicted", 64, torch.float32, "test", "test", {}, {}, {}, 1.0, 1.2, {}, {}))
    measured = {"base": 30.0, "balanced": 20.0, "rows": 25.0}
    timers = []
    rounds = trials.UNTIMED_ROUNDS + trials.TIMED_ROUNDS
    for _ in range(3 * rounds * trials.CALLS_PER_SAMPLE):
        path, timer = cache.choose(lay, 64, torch.float32, CUDA)
        assert cache.settled(64, torch.float32, CUDA) is None
        if timer is not None:
            timer.us = measured[path]
            timers.append(path)
    assert sorted(set(timers)) == ["balanced", "base", "rows"]
    assert len(timers) == 3 * trials.TIMED_ROUNDS * trials.CALLS_PER_SAMPLE
    assert "being measured" in cache.explain(lay, 64, torch.float32, CUDA).reason
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("balanced", None)
    assert cache.choose(lay, 50, torch.float32, CUDA) == ("balanced", None)  # same bucket
    assert cache.settled(64, torch.float32, CUDA) == "balanced"
    explanation = cache.explain(lay, 64, torch.float32, CUDA)
    assert explanation.choice == "balanced" and explanation.measured_us == measured
    assert "predicted base" in explanation.reason
    assert "measured (us, median of the first products): base=30.0" in str(explanation)


def test_cache_waits_for_the_events_with_the_predicted_choice(measured_cache):
    cache, lay = measured_cache
    rounds = trials.UNTIMED_ROUNDS + trials.TIMED_ROUNDS
    pending = [cache.choose(lay, 64, torch.float32, CUDA)[1] for _ in range(3 * rounds * trials.CALLS_PER_SAMPLE)]
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("base", None)  # events not done yet
    for timer in filter(None, pending):
        timer.us = 1.0
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("base", None)  # a tie keeps the prediction
    assert cache.settled(64, torch.float32, CUDA) == "base"


def test_no_trial_where_timing_is_not_allowed(measured_cache, monkeypatch):
    cache, lay = measured_cache
    monkeypatch.setattr(trials, "allowed", lambda device: False)
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("base", None)
    assert cache.settled(64, torch.float32, CUDA) == "base"


def test_a_trial_pauses_where_timing_stops_being_allowed(measured_cache, monkeypatch):
    cache, lay = measured_cache
    path, _ = cache.choose(lay, 64, torch.float32, CUDA)
    monkeypatch.setattr(trials, "allowed", lambda device: False)
    assert [cache.choose(lay, 64, torch.float32, CUDA) for _ in range(20)] == [("base", None)] * 20
    assert cache.settled(64, torch.float32, CUDA) is None


def test_allowed_only_on_cuda_outside_deterministic_mode():
    trials.set_enabled(True)
    assert not trials.allowed(torch.device("cpu"))
    try:
        torch.use_deterministic_algorithms(True)
        assert not trials.allowed(CUDA)
    finally:
        torch.use_deterministic_algorithms(False)
    trials.set_enabled(False)
    try:
        assert not trials.allowed(CUDA)
    finally:
        trials.set_enabled(True)
