import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """These graphs are tiny: one intra-op thread is faster than a team, and far faster when the
    CI cores are shared (an OpenMP team stalls whenever one of its threads is descheduled)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
