"""The tcsparse ops: autograd (gradcheck in float64 for X and the values), torch.library.opcheck,
gradients through edge weights, chunked reference, and CPU speed of the default path."""
import time

import pytest
import torch

from torch_tcsparse import TCSparseTensor, ops
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.engines import reference as reference_engine
from torch_tcsparse.engines.tensor_core import kernel_arrays
from torch_tcsparse.testing import coo_to_dense, random_dense, random_permutation

GRAD_PATHS = ["reference", "csr"]


def matrix(num_rows=23, num_cols=14, seed=0, **options):
    dense = random_dense(num_rows, num_cols, 0.25, seed, torch.float64, dense_row=3)
    return TCSparseTensor.from_dense(dense, **options), dense


MATRIX_OPTIONS = {
    "plain": {},
    "window8": {"window": 8},
    "reordered": {"reorder": random_permutation(23, seed=5), "symmetric": False},
}


def gradcheck(function, inputs, options="plain"):
    # Full Jacobians for the plain matrix; fast mode (random projections, as strict for a wrong
    # gradient) for the variants, to keep the suite within its CPU time budget.
    return torch.autograd.gradcheck(function, inputs, fast_mode=options != "plain")


@pytest.mark.parametrize("options", list(MATRIX_OPTIONS))
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_gradcheck_x(path, options):
    a, _ = matrix(**MATRIX_OPTIONS[options])
    x = torch.randn(14, 2, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x: a.matmul(x, path=path), (x,), options)
    v = torch.randn(14, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v: a.matmul(v, path=path), (v,), options)


@pytest.mark.parametrize("options", list(MATRIX_OPTIONS))
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_gradcheck_values(path, options):
    a, _ = matrix(**MATRIX_OPTIONS[options])
    values = a.csr.values.clone().requires_grad_()
    x = torch.randn(14, 2, dtype=torch.float64)
    assert gradcheck(lambda v: a.with_values(v).matmul(x, path=path), (values,), options)


@pytest.mark.parametrize("path", GRAD_PATHS)
def test_gradcheck_values_and_x_together_and_through_transpose(path):
    a, _ = matrix()
    values = a.csr.values.clone().requires_grad_()
    x = torch.randn(14, 2, dtype=torch.float64, requires_grad=True)
    xt = torch.randn(23, 2, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, x: a.with_values(v).matmul(x, path=path), (values, x), "together")
    assert gradcheck(lambda v, x: a.with_values(v).t().matmul(x, path=path), (values, xt), "transpose")


def test_gradients_equal_dense_autograd():
    a, dense = matrix()
    values = a.csr.values.clone().requires_grad_()
    x = torch.randn(14, 4, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(23, 4, dtype=torch.float64)
    (a.with_values(values) @ x).backward(grad_y)
    dense_x = x.detach().clone().requires_grad_()
    dense_a = dense.clone().requires_grad_()
    (dense_a @ dense_x).backward(grad_y)
    torch.testing.assert_close(x.grad, dense_x.grad)
    row, col = a.csr.row_indices(), a.csr.col.long()
    torch.testing.assert_close(values.grad, dense_a.grad[row, col])


def assert_gradient_for_x_through(function_name: str, a, dense, path: str, n=3):
    """A @ X differentiated for X alone by the autograd Function ``function_name``: dX = A^T dY."""
    x = torch.randn(dense.shape[1], n, dtype=torch.float64, requires_grad=True)
    y = a.matmul(x, path=path)
    assert type(y.grad_fn).__name__ == function_name + "Backward"
    grad_y = torch.randn(dense.shape[0], n, dtype=torch.float64)
    y.backward(grad_y)
    torch.testing.assert_close(x.grad, dense.t() @ grad_y)
    return x


def test_eager_gradients_skip_the_custom_op():
    # Eager products, with or without gradient for the values: the engines' autograd Function.
    a, dense = matrix(reorder=random_permutation(23, seed=5), symmetric=False)
    x = assert_gradient_for_x_through("Product", a, dense, "reference")
    values = a.csr.values.clone().requires_grad_()
    with_values = a.with_values(values).matmul(x, path="reference")
    assert type(with_values.grad_fn).__name__ == "ProductBackward"


@pytest.mark.parametrize("values", ["symmetric", "asymmetric"])
def test_csr_path_backward_multiplies_by_a_transpose_built_once(values):
    # torch.sparse.mm's own backward transposes A (a sort of every nonzero) at every call.
    dense = symmetric_pattern()
    if values == "symmetric":
        dense = dense + dense.t()
    a = TCSparseTensor.from_dense(dense)
    assert_gradient_for_x_through("Product", a, dense, "csr")
    entries = a._cache._entries
    forward = next(key for key in entries if key[0] == "csr" and key[-1] is False)
    kept = entries[forward + ("transposed",)][0]
    # A symmetric matrix is its own transpose: the forward's CSR serves the backward.
    assert (kept is entries[forward][0]) == (values == "symmetric")
    assert_gradient_for_x_through("Product", a, dense, "csr")
    assert entries[forward + ("transposed",)][0] is kept


def symmetric_pattern(n=40, seed=3) -> torch.Tensor:
    """An undirected graph's pattern with different values on (i, j) and (j, i)."""
    pattern = random_dense(n, n, 0.15, seed, torch.float64, dense_row=5) != 0
    pattern = pattern | pattern.t()
    return torch.where(pattern, torch.rand(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5, 0.0)


@pytest.mark.parametrize("reorder", ["none", "permutation"])
def test_transpose_of_a_symmetric_pattern_shares_the_index_arrays(reorder):
    dense = symmetric_pattern()
    options = {} if reorder == "none" else {"reorder": random_permutation(40, seed=2), "symmetric": True}
    a = TCSparseTensor.from_dense(dense, **options)
    at = a.t()
    assert at._structure.layout.block_cols is a._structure.layout.block_cols
    x = torch.randn(40, 3, dtype=torch.float64)
    torch.testing.assert_close(at.matmul(x, path="reference"), dense.t() @ x)
    x.requires_grad_()
    grad_y = torch.randn(40, 3, dtype=torch.float64)
    a.matmul(x, path="reference").backward(grad_y)
    torch.testing.assert_close(x.grad, dense.t() @ grad_y)
    torch.testing.assert_close(at.t().matmul(x.detach(), path="reference"), dense @ x.detach())
    # A copy to a device (here the same one) keeps one set of index arrays for both.
    moved = a._structure.to("cpu")
    assert moved.transposed().layout.block_cols is moved.layout.block_cols
    torch.testing.assert_close(TCSparseTensor(moved, a._values).t().matmul(x.detach(), path="reference"), dense.t() @ x.detach())


def test_transpose_after_a_row_only_reordering_is_built_anew():
    dense = symmetric_pattern()
    a = TCSparseTensor.from_dense(dense, reorder=random_permutation(40, seed=2), symmetric=False)
    at = a.t()
    assert at._structure.layout.block_cols is not a._structure.layout.block_cols
    x = torch.randn(40, 3, dtype=torch.float64)
    torch.testing.assert_close(at.matmul(x, path="reference"), dense.t() @ x)


def test_no_graph_without_requires_grad():
    a, _ = matrix()
    assert not (a @ torch.randn(14, 2, dtype=torch.float64)).requires_grad


def test_edge_weight_gradient_reaches_every_duplicate():
    edge_index = torch.tensor([[0, 1, 0, 2, 0], [1, 2, 1, 0, 1]])  # edge 0 -> 1 three times
    weight = torch.tensor([0.5, 2.0, -1.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 4, dtype=torch.float64)
    grad_y = torch.randn(3, 4, dtype=torch.float64)
    a = TCSparseTensor.from_edge_index(edge_index, weight)
    assert a.nnz == 3
    (a @ x).backward(grad_y)
    # d loss / d w_e = <grad_y[target_e], x[source_e]>, the same for each copy of an edge.
    expected = (grad_y[edge_index[1]] * x[edge_index[0]]).sum(1)
    torch.testing.assert_close(weight.grad, expected)
    assert weight.grad[0] == weight.grad[2] == weight.grad[4]


@pytest.mark.parametrize("path", GRAD_PATHS)
def test_gradcheck_edge_weight(path):
    edge_index = torch.tensor([[0, 1, 0, 2, 3, 3], [1, 2, 1, 0, 3, 0]])
    weight = torch.rand(6, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 3, dtype=torch.float64)

    def product(w):
        return TCSparseTensor.from_edge_index(edge_index, w).matmul(x, path=path)

    assert torch.autograd.gradcheck(product, (weight,))
    reference = coo_to_dense(edge_index[1], edge_index[0], weight.detach(), (4, 4)) @ x
    torch.testing.assert_close(product(weight), reference)


def op_arguments(path, with_transpose=True, sddmm_on="layout"):
    """``tcsparse::spmm``'s arguments for a 23 x 14 matrix on engine ``path``: what a traced
    product passes (the transpose's indices and the gathers only ``with_transpose``; the values'
    gradient from the layout's kernel arrays or, ``sddmm_on="csr"``, from the canonical CSR)."""
    a, _ = matrix()
    s, s_t = a._structure, a.t()._structure
    engine = ENGINES[path]
    indices, ints = engine.flat(engine.indices(s, torch.float64))
    indices_t, ints_t = engine.flat(engine.indices(s_t, torch.float64)) if with_transpose else ([], [])
    gathers = [s.layout.csr_gather, s_t.layout.transpose_gather, s_t.layout.csr_gather] if with_transpose else []
    layout, csr = (kernel_arrays(s.layout), []) if sddmm_on == "layout" else ([], [s.rowptr, s.col])
    x = torch.randn(14, 3, dtype=torch.float64, requires_grad=True)
    values = a.csr.values.clone().requires_grad_()
    return a, (x, values, None, indices, ints, indices_t, ints_t, gathers, layout, csr, [s.window, 23, 14], path)


@pytest.mark.parametrize("sddmm_on", ["layout", "csr"])
@pytest.mark.parametrize("path", ["reference", "csr"])
def test_opcheck_spmm(path, sddmm_on):
    _, args = op_arguments(path, sddmm_on=sddmm_on)
    torch.library.opcheck(torch.ops.tcsparse.spmm, args)


@pytest.mark.parametrize("sddmm_on", ["layout", "csr"])
def test_op_gradients_match_eager(sddmm_on):
    a, (x, values, *rest) = op_arguments("csr", sddmm_on=sddmm_on)
    torch.ops.tcsparse.spmm(x, values, *rest).square().sum().backward()
    eager_x, eager_values = x.detach().clone().requires_grad_(), values.detach().clone().requires_grad_()
    (a.with_values(eager_values) @ eager_x).square().sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)
    torch.testing.assert_close(values.grad, eager_values.grad)


def test_opcheck_spmm_without_transpose_indices():
    _, args = op_arguments("reference", with_transpose=False)
    x, *rest = args
    torch.library.opcheck(torch.ops.tcsparse.spmm, (x.detach(), *rest))


def test_opcheck_sddmm_and_its_values():
    a, _ = matrix()
    s = a._structure
    grad_y = torch.randn(23, 3, dtype=torch.float64)
    x = torch.randn(14, 3, dtype=torch.float64)
    sizes = [s.window, 23, 14]
    torch.library.opcheck(torch.ops.tcsparse.sddmm, (grad_y, x, kernel_arrays(s.layout), sizes))
    out = torch.ops.tcsparse.sddmm(grad_y, x, kernel_arrays(s.layout), sizes)
    row, col = a.csr.row_indices(), a.csr.col.long()
    torch.testing.assert_close(out, (grad_y[row] * x[col]).sum(1))


@pytest.mark.parametrize("path", ["reference", "csr"])
def test_op_output_matches_dense(path):
    a, dense = matrix()
    _, (x, values, *rest) = op_arguments(path)
    y = torch.ops.tcsparse.spmm(x.detach(), values.detach(), *rest)
    torch.testing.assert_close(y, dense @ x.detach())


def test_reference_is_the_same_in_small_chunks(monkeypatch):
    a, dense = matrix(70, 50, seed=3)
    x = torch.randn(50, 5, dtype=torch.float64)
    whole = a.matmul(x, path="reference")
    monkeypatch.setattr(reference_engine, "CHUNK_ELEMENTS", 16 * 8 * 5 * 3)  # three blocks per chunk
    chunked = a.matmul(x, path="reference")
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(chunked, dense @ x)
    values = a.csr.values.clone().requires_grad_()
    (a.with_values(values) @ x).sum().backward()
    row = a.csr.row_indices()
    torch.testing.assert_close(values.grad, x.sum(1)[a.csr.col.long()] * torch.ones_like(row, dtype=torch.float64))


def _best_seconds_interleaved(first, second, rounds):
    """Best time of each of two functions, run alternately so that both see the same load."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, function in enumerate((first, second)):
            start = time.perf_counter()
            function()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


@pytest.mark.slow
def test_auto_path_on_cpu_is_as_fast_as_torch_sparse():
    # The default CPU path is torch's own CSR product: it must cost at most 1.5x of calling
    # torch.sparse.mm directly. Alternating runs and the best time of each absorb the noise of
    # other processes on a shared machine (a slower run is only ever slowed down by others).
    generator = torch.Generator().manual_seed(0)
    n, nnz = 50_000, 1_000_000
    row = torch.randint(0, n, (nnz,), generator=generator)
    col = torch.randint(0, n, (nnz,), generator=generator)
    a = TCSparseTensor.from_coo(row, col, torch.rand(nnz, generator=generator), (n, n))
    csr = a.to_torch_csr()
    x = torch.randn(n, 32, generator=generator)
    torch.testing.assert_close(a @ x, torch.sparse.mm(csr, x))
    ours, theirs = _best_seconds_interleaved(lambda: a @ x, lambda: torch.sparse.mm(csr, x), rounds=15)
    assert ours <= 1.5 * theirs, f"A @ X takes {ours * 1e3:.1f} ms, torch.sparse.mm {theirs * 1e3:.1f} ms"


@pytest.mark.parametrize("path", GRAD_PATHS)
@pytest.mark.parametrize("grad_kind", ["expanded", "transposed"])
def test_backward_with_non_contiguous_output_gradient(path, grad_kind):
    # sum() hands backward an expanded (stride 0) gradient, a transpose a column-major one.
    a, dense = matrix()
    values = a.csr.values.clone().requires_grad_()
    x = torch.randn(14, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 23, dtype=torch.float64)
    y = a.with_values(values).matmul(x, path=path)
    loss = y.sum() if grad_kind == "expanded" else (y.t() * weight).sum()
    loss.backward()
    grad_y = torch.ones(23, 3, dtype=torch.float64) if grad_kind == "expanded" else weight.t()
    torch.testing.assert_close(x.grad, dense.t() @ grad_y)
    row, col = a.csr.row_indices(), a.csr.col.long()
    torch.testing.assert_close(values.grad, (grad_y[row] * x.detach()[col]).sum(1))


def test_gradient_through_from_dense_reaches_the_nonzeros():
    dense = random_dense(12, 9, 0.3, seed=7, dtype=torch.float64).requires_grad_()
    x = torch.randn(9, 2, dtype=torch.float64)
    (TCSparseTensor.from_dense(dense) @ x).sum().backward()
    mask = (dense.detach() != 0).double()
    torch.testing.assert_close(dense.grad, mask * (torch.ones(12, 2, dtype=torch.float64) @ x.t()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_backward_on_the_reference_path(dtype):
    a, dense = matrix()
    a = a.to(dtype)
    x = torch.randn(14, 4).to(dtype).requires_grad_()
    values = a.csr.values.clone().requires_grad_()
    (a.with_values(values) @ x).float().sum().backward()
    assert x.grad.dtype == dtype and values.grad.dtype == dtype
    expected_x = dense.t() @ torch.ones(23, 4, dtype=torch.float64)
    torch.testing.assert_close(x.grad.double(), expected_x, rtol=1e-2, atol=1e-2)
    col = a.csr.col.long()
    torch.testing.assert_close(values.grad.double(), x.detach().double()[col].sum(1), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(3, 4), (0, 4), (3, 0)])
@pytest.mark.parametrize("path", GRAD_PATHS)
def test_gradients_of_a_matrix_without_nonzeros(shape, path):
    a = TCSparseTensor.from_dense(torch.zeros(shape, dtype=torch.float64))
    x = torch.randn(shape[1], 2, dtype=torch.float64, requires_grad=True)
    values = a.csr.values.clone().requires_grad_()
    a.with_values(values).matmul(x, path=path).sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert values.grad.shape == (0,)
