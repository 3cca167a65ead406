"""Every user input kind to canonical CSR, and the validation of each entry point."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric import EdgeIndex

from torch_tcsparse.formats import inputs
from torch_tcsparse.testing import coo_to_dense, random_coo, tensor


def dense_of(csr):
    return coo_to_dense(csr.row_indices(), csr.col, csr.values, (csr.num_rows, csr.num_cols))


EDGE_INDEX = tensor([[0, 0, 1, 3, 0], [1, 2, 2, 0, 1]])
EDGE_WEIGHT = tensor([1.0, 2.0, 3.0, 4.0, 5.0])


def test_edge_index_puts_weight_at_target_source():
    csr = inputs.from_edge_index(EDGE_INDEX, EDGE_WEIGHT)
    expected = torch.zeros(4, 4, dtype=torch.float64)
    expected[1, 0] = 1.0 + 5.0  # the duplicate edge 0 -> 1 is summed
    expected[2, 0], expected[2, 1], expected[0, 3] = 2.0, 3.0, 4.0
    assert (csr.num_rows, csr.num_cols) == (4, 4)
    assert torch.equal(dense_of(csr), expected)


def test_edge_index_without_weight_counts_edges():
    csr = inputs.from_edge_index(EDGE_INDEX, num_nodes=6)
    assert (csr.num_rows, csr.num_cols) == (6, 6) and csr.values.dtype == torch.float32
    assert float(dense_of(csr)[1, 0]) == 2.0 and float(dense_of(csr).sum()) == 5.0


def test_edge_index_num_nodes_pair_is_sources_then_targets():
    csr = inputs.from_edge_index(EDGE_INDEX, EDGE_WEIGHT, num_nodes=(5, 3))
    assert (csr.num_rows, csr.num_cols) == (3, 5)
    assert float(dense_of(csr)[0, 3]) == 4.0


def test_pyg_edge_index_sparse_size_sets_the_shape():
    edge_index = EdgeIndex(EDGE_INDEX, sparse_size=(7, 4))
    csr = inputs.from_edge_index(edge_index, EDGE_WEIGHT)
    assert (csr.num_rows, csr.num_cols) == (4, 7)
    assert torch.equal(dense_of(csr)[:, :4], dense_of(inputs.from_edge_index(EDGE_INDEX, EDGE_WEIGHT)))


def test_pyg_edge_index_without_sparse_size_is_inferred():
    csr = inputs.from_edge_index(EdgeIndex(EDGE_INDEX))
    assert (csr.num_rows, csr.num_cols) == (4, 4)


def test_edge_index_dtype_casts_integer_weights():
    csr = inputs.from_edge_index(EDGE_INDEX, tensor([1, 2, 3, 4, 5]), dtype=torch.float64)
    assert csr.values.dtype == torch.float64 and float(dense_of(csr)[1, 0]) == 6.0


def test_empty_edge_index():
    csr = inputs.from_edge_index(torch.empty(2, 0, dtype=torch.long))
    assert (csr.num_rows, csr.num_cols, csr.nnz) == (0, 0, 0)


EDGE_INDEX_ERRORS = [
    ("shape", dict(edge_index=tensor([[0, 1, 2]])), ValueError, r"\[2, E\].*\(1, 3\)"),
    ("float", dict(edge_index=tensor([[0.0], [1.0]])), TypeError, r"edge_index.*integers.*float32"),
    ("source out of range", dict(num_nodes=3, edge_index=tensor([[0, 5], [1, 2]])), ValueError, r"5.*size 3"),
    ("negative", dict(edge_index=tensor([[0, -1], [1, 2]])), ValueError, r"negative.*-1"),
    ("bad pair", dict(num_nodes=(3,)), ValueError, r"num_nodes.*\(3,\)"),
    ("integer weight", dict(edge_weight=tensor([1, 2])), TypeError, r"edge_weight.*int64.*dtype="),
    ("2-D weight", dict(edge_weight=torch.ones(2, 1)), ValueError, r"edge_weight.*1-D.*\(2, 1\)"),
    ("weight count", dict(edge_weight=torch.ones(3)), ValueError, r"\(2\).*\(3,\)"),
    ("weight list", dict(edge_weight=[1.0, 2.0]), TypeError, r"edge_weight.*list"),
]


@pytest.mark.parametrize("case", EDGE_INDEX_ERRORS, ids=[c[0] for c in EDGE_INDEX_ERRORS])
def test_edge_index_rejects(case):
    _, override, error, message = case
    args = dict(edge_index=tensor([[0, 1], [1, 2]]), edge_weight=None, num_nodes=None) | override
    with pytest.raises(error, match=message):
        inputs.from_edge_index(args["edge_index"], args["edge_weight"], args["num_nodes"])


def test_coo_and_csr_infer_shape_from_indices():
    coo = inputs.from_coo(tensor([2, 0]), tensor([1, 4]))
    assert (coo.num_rows, coo.num_cols) == (3, 5)
    csr = inputs.from_csr(tensor([0, 1, 1, 2]), tensor([4, 1]))
    assert (csr.num_rows, csr.num_cols) == (3, 5)


def test_coo_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"shape.*pair.*\(2,\)"):
        inputs.from_coo(tensor([0]), tensor([0]), shape=(2,))
    with pytest.raises(ValueError, match=r"col.*3.*size 2"):
        inputs.from_coo(tensor([0]), tensor([3]), shape=(2, 2))


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr"])
def test_scipy_any_format(fmt):
    row, col, values = random_coo(13, 7, 0.3, seed=5, dtype=torch.float64)
    dense = coo_to_dense(row, col, values, (13, 7))
    matrix = sp.coo_matrix((values.numpy(), (row.numpy(), col.numpy())), shape=(13, 7)).asformat(fmt)
    csr = inputs.from_scipy(matrix)
    assert csr.values.dtype == torch.float64
    assert torch.equal(dense_of(csr), dense)


def test_scipy_duplicates_are_summed():
    matrix = sp.coo_matrix((np.array([1.0, 2.0], np.float32), (np.array([0, 0]), np.array([1, 1]))), shape=(2, 2))
    csr = inputs.from_scipy(matrix)
    assert csr.values.tolist() == [3.0] and csr.values.dtype == torch.float32


def test_scipy_sparse_array_and_dtype():
    csr = inputs.from_scipy(sp.csr_array(np.eye(3, dtype=np.int64)), dtype=torch.float32)
    assert csr.values.dtype == torch.float32 and csr.values.tolist() == [1.0, 1.0, 1.0]


def test_scipy_rejects():
    with pytest.raises(TypeError, match=r"scipy\.sparse.*ndarray"):
        inputs.from_scipy(np.eye(3))
    with pytest.raises(TypeError, match=r"int64.*dtype=torch.float32"):
        inputs.from_scipy(sp.eye(3, dtype=np.int64, format="csr"))


def test_torch_coo_uncoalesced_and_csr():
    indices = tensor([[1, 0, 1], [2, 0, 2]])
    coo = torch.sparse_coo_tensor(indices, tensor([1.0, 2.0, 3.0]), (2, 3))
    csr = inputs.from_torch(coo)
    assert csr.col.tolist() == [0, 2] and csr.values.tolist() == [2.0, 4.0]
    from_csr = inputs.from_torch(coo.coalesce().to_sparse_csr())
    assert torch.equal(dense_of(from_csr), dense_of(csr))


def test_torch_rejects():
    with pytest.raises(ValueError, match=r"2-D.*3 dimensions"):
        inputs.from_torch(torch.zeros(2, 2, 2).to_sparse())
    with pytest.raises(TypeError, match=r"ndarray"):
        inputs.from_torch(np.eye(2))


def test_dense_keeps_only_nonzeros():
    dense = tensor([[0.0, 1.5, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 3.0]], dtype=torch.float64)
    csr = inputs.from_dense(dense)
    assert csr.nnz == 3 and csr.rowptr.tolist() == [0, 1, 1, 3]
    assert torch.equal(dense_of(csr), dense)


def test_dense_rejects():
    with pytest.raises(TypeError, match=r"dense \(strided\)"):
        inputs.from_dense(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match=r"2-D.*\(3,\)"):
        inputs.from_dense(torch.ones(3))
    with pytest.raises(TypeError, match=r"int64.*dtype="):
        inputs.from_dense(torch.eye(3, dtype=torch.int64))


def test_complex_values_are_refused_not_cast():
    with pytest.raises(TypeError, match=r"complex.*complex128"):
        inputs.from_scipy(sp.eye(3, dtype=np.complex128, format="csr"), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"values.*complex64"):
        inputs.from_coo(tensor([0]), tensor([0]), torch.ones(1, dtype=torch.complex64), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"values.*complex64"):
        inputs.from_dense(torch.eye(2, dtype=torch.complex64), dtype=torch.float64)


def test_torch_hybrid_tensors_are_refused():
    hybrid_csr = torch.sparse_csr_tensor(tensor([0, 1, 1]), tensor([0]), torch.ones(1, 2), (2, 2, 2))
    with pytest.raises(ValueError, match=r"2-D.*3 dimensions"):
        inputs.from_torch(hybrid_csr)
    hybrid_coo = torch.sparse_coo_tensor(tensor([[0, 1]]), torch.ones(2, 3), (2, 3))
    with pytest.raises(ValueError, match=r"dense_dim=1"):
        inputs.from_torch(hybrid_coo)


@pytest.mark.parametrize(
    "shape, message",
    [((1, 2**62), r"\(1, 4611686018427387904\)"), ((2**31, 2**33), r"\(2147483648, 8589934592\)"), ((2, -1), r"-1")],
)
def test_shapes_beyond_int64_indexing_are_refused(shape, message):
    with pytest.raises(ValueError, match=message):
        inputs.from_coo(tensor([0]), tensor([0]), shape=shape)
    with pytest.raises(ValueError, match=message):
        inputs.from_csr(tensor([0, 1]), tensor([0]), shape=shape)


def test_csr_needs_a_rowptr_entry():
    with pytest.raises(ValueError, match=r"rowptr.*at least one.*\(0,\)"):
        inputs.from_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))


def test_dtype_must_be_a_value_dtype():
    with pytest.raises(TypeError, match=r"dtype.*torch.int64"):
        inputs.from_edge_index(EDGE_INDEX, dtype=torch.int64)
