"""Suite-wide settings: modest, deterministic hypothesis runs and a seeded torch RNG per test."""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Property tests build a layout per example; 25 examples keep the suite within its time budget
# on 2 CPU cores. TCSPARSE_HYPOTHESIS_EXAMPLES raises it for a deeper local run.
settings.register_profile(
    "tcsparse",
    max_examples=int(os.environ.get("TCSPARSE_HYPOTHESIS_EXAMPLES", 25)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("tcsparse")


@pytest.fixture(autouse=True)
def seeded_torch():
    torch.manual_seed(0)
