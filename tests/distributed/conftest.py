"""One intra-op thread for the partitioner's tests in this process: their graphs are small, and a
team of threads stalls on shared CI cores (the process tests set their own threads)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
