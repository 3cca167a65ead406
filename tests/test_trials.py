"""Measured choices (torch_tcsparse.trials): the shortlist, a trial's calls and samples, and how a
SelectionCache settles on the fastest candidate. CPU only, with a fake clock; a trial on CUDA
events runs in tests/gpu/test_trials.py."""
import pytest
import torch

from torch_tcsparse import selector, trials
from torch_tcsparse.formats.inputs import from_coo
from torch_tcsparse.formats.metcf import build_metcf
from torch_tcsparse.selector import CALIBRATED_CHOICES, SelectionCache, cache

CUDA = torch.device("cuda", 0)


class FakeProducts:
    """A product per path that costs ``us[path]`` on a fake clock, and timers reading it."""

    def __init__(self, us):
        self.us = us
        self.now = 0.0
        self.paths = []
        self.waited = False

    def __call__(self, path):
        self.paths.append(path)
        self.now += self.us[path]
        return f"product on {path}"

    def timer(self):
        products = self

        class Timer:
            def start(self):
                self.began = products.now

            def stop(self):
                self.ended = products.now

            def wait(self):
                products.waited = True

            def elapsed_us(self):
                assert products.waited, "events read before the synchronisation"
                return self.ended - self.began

        return Timer()


def layout():
    g = torch.Generator().manual_seed(0)
    row, col = torch.randint(0, 300, (2000,), generator=g), torch.randint(0, 300, (2000,), generator=g)
    return build_metcf(from_coo(row, col, None, (300, 300), None), 16)[0]


def test_shortlist_keeps_the_choice_first_and_the_close_candidates():
    costs = {"base": 10.0, "balanced": 12.9, "csr": 13.1, "rows": 11.0}
    assert trials.shortlist("base", costs, CALIBRATED_CHOICES) == ("base", "balanced", "rows")
    assert trials.shortlist("rows", costs, ("rows", "csr")) == ("rows", "csr")  # csr 19% above rows
    assert trials.shortlist("csr", costs, CALIBRATED_CHOICES) == ("csr", "base", "balanced", "rows")


def test_samples_last_about_sample_us_by_the_prediction():
    assert trials.sample_calls(trials.SAMPLE_US / 10) == 10
    assert trials.sample_calls(trials.SAMPLE_US) == trials.CALLS_PER_SAMPLE
    assert trials.sample_calls(0.0) == trials.MAX_CALLS_PER_SAMPLE


def test_a_trial_warms_up_then_times_interleaved_samples_of_each_path():
    products = FakeProducts({"rows": 10.0, "csr": 20.0})
    trial = trials.Trial(("rows", "csr"), calls=(3, 5), key="bucket", timer=products.timer)
    measured, output = trial.run(products)
    warm = trials.UNTIMED_CALLS
    assert products.paths == ["rows"] * warm + ["csr"] * warm + (["rows"] * 3 + ["csr"] * 5) * trials.TIMED_ROUNDS
    assert measured == {"rows": pytest.approx(10.0), "csr": pytest.approx(20.0)}
    assert output == "product on csr"  # the last product computed


def test_fastest_gives_a_near_tie_to_csr():
    assert trials.fastest({"rows": 40.0, "base": 45.0}) == "rows"
    assert trials.fastest({"rows": 40.0, "csr": 41.9}) == "csr"
    assert trials.fastest({"rows": 40.0, "csr": 42.1}) == "rows"


@pytest.fixture
def measured_cache(monkeypatch):
    """A SelectionCache that believes it runs on CUDA with every path of a matrix without a
    grouped layout available, and predicts base at 10 us with balanced and rows close, csr far."""
    costs = {"base": 10.0, "balanced": 12.0, "csr": 30.0, "rows": 11.0}
    monkeypatch.setattr(cache.kernels, "usable_for", lambda dtype, device: True)
    monkeypatch.setattr(cache.native, "choose", lambda features, query, candidates: "base")
    monkeypatch.setattr(cache.native, "choose_with_costs", lambda features, query, candidates: ("base", costs))
    monkeypatch.setattr(cache, "explain_features", lambda *args: selector.Explanation(
        "base", "predicted", 64, torch.float32, "test", "test", {}, {}, {}, 1.0, 1.2, {}, {}))
    monkeypatch.setattr(trials, "allowed", lambda device: True)
    return SelectionCache(), layout()


def test_the_first_product_measures_the_shortlist_and_settles_the_bucket(measured_cache):
    cache, lay = measured_cache
    path, trial = cache.choose(lay, 64, torch.float32, CUDA)
    assert path == "base" and trial.paths == ("base", "balanced", "rows")
    assert "to be measured: base, balanced, rows" in cache.explain(lay, 64, torch.float32, CUDA).reason
    products = FakeProducts({"base": 30.0, "balanced": 20.0, "rows": 25.0})
    trial._timer = products.timer
    assert cache.measure(trial, products) == "product on rows"
    assert cache.settled(64, torch.float32, CUDA) == "balanced"  # from the measuring product on
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("balanced", None)
    assert cache.choose(lay, 50, torch.float32, CUDA) == ("balanced", None)  # same bucket
    assert cache.settled(64, torch.float32, CUDA) == "balanced"
    explanation = cache.explain(lay, 64, torch.float32, CUDA)
    assert explanation.choice == "balanced"
    assert explanation.measured_us == pytest.approx({"base": 30.0, "balanced": 20.0, "rows": 25.0})
    assert "predicted base" in explanation.reason
    assert "measured (us, median of the first product's samples): base=30.0" in str(explanation)


def test_no_trial_where_timing_is_not_allowed(measured_cache, monkeypatch):
    cache, lay = measured_cache
    monkeypatch.setattr(trials, "allowed", lambda device: False)
    assert cache.choose(lay, 64, torch.float32, CUDA) == ("base", None)
    assert cache.settled(64, torch.float32, CUDA) == "base"


def test_a_trial_waits_for_a_product_where_timing_is_allowed(measured_cache, monkeypatch):
    cache, lay = measured_cache
    _, trial = cache.choose(lay, 64, torch.float32, CUDA)
    monkeypatch.setattr(trials, "allowed", lambda device: False)
    assert [cache.choose(lay, 64, torch.float32, CUDA) for _ in range(3)] == [("base", None)] * 3
    assert cache.settled(64, torch.float32, CUDA) is None
    monkeypatch.setattr(trials, "allowed", lambda device: True)
    assert cache.choose(lay, 64, torch.float32, CUDA)[1] is trial


def test_off_by_default():
    assert not trials.is_enabled()


def test_allowed_only_when_enabled_on_cuda_outside_deterministic_mode():
    assert not trials.allowed(CUDA)
    trials.set_enabled(True)
    try:
        assert not trials.allowed(torch.device("cpu"))
        torch.use_deterministic_algorithms(True)
        assert not trials.allowed(CUDA)
    finally:
        torch.use_deterministic_algorithms(False)
        trials.set_enabled(False)
