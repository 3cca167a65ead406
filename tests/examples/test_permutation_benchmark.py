"""benchmarks/permutation.py's two matrices on the CPU: the one holding the permutation and the
one permuted beforehand have the same blocks per window and the same product, up to the order."""
import pytest
import torch

from benchmarks import permutation as permutation_benchmark
from graph_data import synthetic
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import reorder


@pytest.mark.parametrize("method", ["tca", "degree"])
def test_inside_and_before_are_one_matrix(method):
    row, col, num_nodes = synthetic.sbm(600, 6, 8, shuffled=True, seed=2)
    perm = reorder(from_coo(row, col, None, num_nodes, num_nodes), method)
    inside, before, position = permutation_benchmark.tensors(row, col, num_nodes, perm, torch.float32)
    assert torch.equal(inside._structure.layout.window_offsets, before._structure.layout.window_offsets)
    assert torch.equal(perm[position], torch.arange(num_nodes))
    x = torch.randn(num_nodes, 16, dtype=torch.float64)
    torch.testing.assert_close((inside.double() @ x)[perm], before.double() @ x[perm])
