"""GPU tests of measured choices (torch_tcsparse.trials): every product of a trial is right, the
choice settles on a measured candidate, and no trial runs where timing is not allowed."""
import time

import pytest
import torch

from torch_tcsparse import TCSparseTensor, trials

from .kernel_data import random_matrix, reference, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def matrix(m=3000):
    row, col, values = random_matrix(m, m, 10)
    return TCSparseTensor.from_coo(row, col, values, shape=(m, m)), (row, col, values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_product_of_a_trial_is_right_and_the_choice_settles(kernels, monkeypatch, dtype):
    monkeypatch.setattr(trials, "MARGIN", 100.0)  # every path a candidate
    monkeypatch.setattr(trials, "SAMPLE_US", 0.0)  # samples of CALLS_PER_SAMPLE calls
    a, (row, col, values) = matrix()
    a = a.to(dtype)
    x = torch.randn(a.shape[1], 64, device="cuda").to(dtype)
    expected = reference(row, col, values.to(dtype), x, a.shape[0])
    limit = 4 * 4 * (trials.UNTIMED_ROUNDS + trials.TIMED_ROUNDS) * trials.CALLS_PER_SAMPLE
    bound = 4e-3  # TF32 Tensor Cores, or one float16 rounding of the output, with room
    for _ in range(limit):
        y = a @ x
        assert relative_error(y, expected) < bound
        torch.cuda.synchronize()
        settled = a._structure.selection.settled(64, dtype, x.device)
        if settled is not None:
            break
    assert settled is not None, f"no settled path after {limit} products"
    explanation = a.explain(64)
    assert explanation.choice == settled
    assert set(explanation.measured_us) == set(explanation.candidates)
    assert trials.fastest(explanation.measured_us) == settled


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
    assert a.explain(32).measured_us == {}


def sleep_kernel_us(cycles):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end)


def timed_sample(cycles, host_stall_s=0.0, charged=False, lead_in_stall_s=0.0, calls=4):
    """A CudaTimer over ``calls`` calls of one sleep kernel each; before every call but the
    first the host stalls ``host_stall_s``, charged to the timer as the trial's own if
    ``charged``; before the first, ``lead_in_stall_s``."""
    timer = trials.CudaTimer(calls)
    torch.cuda.synchronize()
    for call in range(calls):
        stall = lead_in_stall_s if call == 0 else host_stall_s
        started = time.perf_counter()
        time.sleep(stall)
        if charged and call:
            timer.charge(time.perf_counter() - started)
        with timer:
            torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    assert timer.done()
    return timer.elapsed_us()


def test_a_timer_leaves_out_what_precedes_its_first_call():
    """A stall of the host before the first kernel (the GPU idle after a synchronisation) is not
    timed; the calls after the first are."""
    kernel_us = sleep_kernel_us(2_000_000)
    assert 0.5 * kernel_us < timed_sample(2_000_000, lead_in_stall_s=0.05) < 3 * kernel_us


def test_a_timer_leaves_out_the_trials_host_time_where_the_gpu_waits_for_it():
    """Short kernels behind 3 ms host stalls: charged to the trial, the stalls are left out;
    uncharged (the product's own host time), they are the cost of a call."""
    assert timed_sample(1000, host_stall_s=0.003, charged=True) < 1000
    assert timed_sample(1000, host_stall_s=0.003, charged=False) > 2500


def test_a_timer_keeps_the_gpu_time_where_the_host_waits_for_it():
    """Long kernels, each queued behind the last: the span is the GPU's, whatever the host did."""
    kernel_us = sleep_kernel_us(20_000_000)
    measured = timed_sample(20_000_000, host_stall_s=0.0005, charged=True)
    assert 0.8 * kernel_us < measured < 1.3 * kernel_us
