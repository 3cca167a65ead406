"""GPU tests of measured choices (torch_tcsparse.trials): the product that measures the choice is
right, the choice settles on a measured candidate, a path slower on the host measures slower, and
no trial runs where timing is not allowed."""
import time

import pytest
import torch

from torch_tcsparse import TCSparseTensor, trials

from .kernel_data import SUBSET, random_matrix, reference, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def trials_on():
    """Trials are opt-in (``trials.set_enabled``): every test here turns them on."""
    trials.set_enabled(True)
    yield
    trials.set_enabled(False)


def matrix(m=3000):
    row, col, values = random_matrix(m, m, 10)
    return TCSparseTensor.from_coo(row, col, values, shape=(m, m)), (row, col, values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_measuring_product_is_right_and_the_choice_settles(kernels, monkeypatch, dtype):
    monkeypatch.setattr(trials, "MARGIN", 100.0)  # every path a candidate
    a, (row, col, values) = matrix()
    a = a.to(dtype)
    x = torch.randn(a.shape[1], 64, device="cuda").to(dtype)
    expected = reference(row, col, values.to(dtype), x, a.shape[0])
    bound = 4e-3  # TF32 Tensor Cores, or one float16 rounding of the output, with room
    assert a._structure.selection.settled(64, dtype, x.device) is None
    for _ in range(2):
        assert relative_error(a @ x, expected) < bound
    settled = a._structure.selection.settled(64, dtype, x.device)
    explanation = a.explain(64)
    assert explanation.choice == settled
    assert set(explanation.measured_us) == set(explanation.candidates)
    assert trials.fastest(explanation.measured_us) == settled


@pytest.mark.skipif(SUBSET, reason="host timings under compute-sanitizer say nothing about the trial")
def test_a_path_slower_on_the_host_measures_slower(kernels):
    def product(path):
        if path == "slow":
            time.sleep(0.0003)
        torch.cuda._sleep(1000)

    trial = trials.Trial(("fast", "slow"), calls=(4, 4))
    measured, _ = trial.run(product)
    assert measured["slow"] > 300 > measured["fast"]


def test_no_trial_in_deterministic_mode(kernels, monkeypatch):
    monkeypatch.setattr(trials, "MARGIN", 100.0)
    a, _ = matrix()
    x = torch.randn(a.shape[1], 32, device="cuda")
    torch.use_deterministic_algorithms(True)
    try:
        a @ x
    finally:
        torch.use_deterministic_algorithms(False)
    assert a._structure.selection.settled(32, x.dtype, x.device) == a.explain(32).choice
    assert not a.explain(32).measured_us
