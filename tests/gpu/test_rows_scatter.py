"""GPU tests of dX = A^T dY scattered from the "rows" kernel's operands (csrc/csr_rows_scatter.cu)
and of the backward passes that take it (``product.scatters_transpose``: a matrix's first, outside
deterministic mode), against float64 references.

Fresh random data each run, outputs poisoned with NaN first. The scatter adds the nonzeros of a
column of A into its row of dX by fp32 atomics in any order: besides the product's own bounds
(test_rows.py: 4 x torch's error in float32, 4 x the larger of torch's dense error and one rounding
in 16 bits), a sum of d terms in any order may err by about eps sqrt(d) relative, d being the
longest column's nonzeros (4 x that, as torch's tolerance is 4 x its error).
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, csr_rows, kernels
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.formats.csr import from_coo

from .kernel_data import (
    SUBSET,
    poison,
    product_tolerance,
    reference,
    relative_error,
    rows_of_lengths,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
N = [3, 32, 257] if SUBSET else [1, 3, 32, 33, 64, 128, 257]
# Empty rows, short ones, and hub rows of 10,000 nonzeros that split into pieces.
LENGTHS = [0, 0, 1, 3, 8, 33, 40, 70, 300, 10_000]
HUB_COLUMN = 7


def graph_coo(m, k, hub_column_share=0.05):
    """COO of ``LENGTHS`` rows (1% hubs), a share of the nonzeros moved to one hub column, whose
    atomics all land on one row of dX."""
    row, col, values = rows_of_lengths(m, k, LENGTHS, hub_share=0.01)
    col = torch.where(torch.rand(col.numel(), device="cuda") < hub_column_share, HUB_COLUMN, col)
    return row, col, values


def scatter_tolerance(transpose, grad_y, ref):
    """For dX = ``transpose`` @ grad_y (``transpose``: A^T's CSR, its rows A's columns) equal to
    ``ref``: the product's bound, or the atomics' eps sqrt(d) for the longest column of A."""
    longest = int((transpose.rowptr[1:] - transpose.rowptr[:-1]).max()) if transpose.num_rows else 0
    atomics = 4 * 2.0**-24 * max(longest, 1) ** 0.5 + 1e-7
    return max(product_tolerance(transpose, grad_y, ref, ref), atomics)


def check_scatter(csr, pieces, grad_y, rmap=None):
    """The kernel's dX = A^T grad_y (CSR row i's gradient from row rmap[i] of grad_y) against the
    float64 reference; both of dX's buffers (fp32 sums, 16-bit result) poisoned first."""
    m, k, n = csr.num_rows, csr.num_cols, grad_y.shape[1]
    r, c = csr.row_indices().long(), csr.col.long()
    y_rows = r if rmap is None else rmap.long()[r]
    ref = reference(c, y_rows, csr.values, grad_y, k)
    poison(k * n + 1)
    poison(k * n * grad_y.dtype.itemsize // 4 + 1)
    out = kernels.csr_rows_scatter(grad_y, csr.rowptr, csr.col, csr.values, pieces, k, rmap)
    torch.cuda.synchronize()
    assert out.dtype == grad_y.dtype and out.shape == (k, n)
    err = relative_error(out, ref)
    if ref.norm() == 0:
        assert err == 0.0
        return out
    limit = scatter_tolerance(from_coo(c, y_rows, csr.values, k, m), grad_y, ref)
    assert err <= limit, f"relative error {err:.3g} over {limit:.3g} (n={n} {grad_y.dtype})"
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", N)
@pytest.mark.parametrize("row_map", [False, True], ids=["in_order", "row_map"])
def test_scatter_of_split_padded_and_empty_rows(row_map, n, dtype):
    """Hub rows by their pieces (the exact split, and the padded one whose tail the kernel skips),
    empty rows, a hub column; rows through a random row map."""
    m, k = 3000, 20_000
    row, col, values = graph_coo(m, k)
    csr = from_coo(row, col, values.to(dtype), m, k)
    rmap = torch.randperm(m, device="cuda").int() if row_map else None
    grad_y = torch.randn(m, n, device="cuda").to(dtype)
    exact = csr_rows.row_pieces(csr.rowptr, 32)
    padded = csr_rows.row_pieces(csr.rowptr, 32, None, csr.nnz)
    assert padded.piece_slots.numel() > exact.piece_slots.numel() > 0
    for pieces in (exact, padded, csr_rows.row_pieces(csr.rowptr, csr_rows.UNSPLIT)):
        check_scatter(csr, pieces, grad_y, rmap)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("first", [0, 1, 2, 4])
@pytest.mark.parametrize("n", [3, 32, 64])
def test_grad_y_slices_of_every_alignment(n, first, dtype):
    """dY a column slice of a wider tensor: its loads take the widest vector its stride and first
    element allow (4, 2 or 1 elements)."""
    m, k = 2000, 5000
    row, col, values = graph_coo(m, k)
    csr = from_coo(row, col, values.to(dtype), m, k)
    wide = torch.randn(m, n + 6, device="cuda").to(dtype)
    check_scatter(csr, csr_rows.row_pieces(csr.rowptr, 32), wide[:, first:first + n])
    check_scatter(csr, csr_rows.row_pieces(csr.rowptr, 32), torch.randn(1, n, device="cuda").to(dtype).expand(m, n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_matrices_give_zeros(dtype):
    for m, k in ((0, 10), (10, 0), (50, 40)):
        csr = from_coo(torch.empty(0, dtype=torch.long, device="cuda"), torch.empty(0, dtype=torch.long, device="cuda"),
                       torch.empty(0, device="cuda").to(dtype), m, k)
        poison(k * 8 + 1)
        out = kernels.csr_rows_scatter(torch.randn(m, 8, device="cuda").to(dtype), csr.rowptr, csr.col, csr.values,
                                       csr_rows.row_pieces(csr.rowptr, 32), k)
        assert out.shape == (k, 8) and out.dtype == dtype and not bool(out.any())


def test_rejects_bad_inputs():
    m, k = 100, 80
    row, col, values = graph_coo(m, k)
    csr = from_coo(row, col, values, m, k)
    pieces = csr_rows.row_pieces(csr.rowptr, 32)
    g = torch.randn(m, 4, device="cuda")
    with pytest.raises(RuntimeError, match="grad_y must be 2-D with 100 rows"):
        kernels.csr_rows_scatter(g[:50], csr.rowptr, csr.col, csr.values, pieces, k)
    with pytest.raises(RuntimeError, match="values must be Half like grad_y, got Float"):
        kernels.csr_rows_scatter(g.half(), csr.rowptr, csr.col, csr.values, pieces, k)
    with pytest.raises(RuntimeError, match="grad_y must be float32, float16 or bfloat16, got Double"):
        kernels.csr_rows_scatter(g.double(), csr.rowptr, csr.col, csr.values.double(), pieces, k)
    with pytest.raises(RuntimeError, match="col must be Int, got Long"):
        kernels.csr_rows_scatter(g, csr.rowptr, csr.col.long(), csr.values, pieces, k)
    with pytest.raises(RuntimeError, match="row_map must be 1-D with 100 entries"):
        kernels.csr_rows_scatter(g, csr.rowptr, csr.col, csr.values, pieces, k, torch.arange(99, device="cuda").int())
    with pytest.raises(RuntimeError, match="grad_y is on cpu"):
        kernels.csr_rows_scatter(g.cpu(), csr.rowptr, csr.col, csr.values, pieces, k)
    with pytest.raises(RuntimeError, match="num_cols must be non-negative"):
        kernels.csr_rows_scatter(g, csr.rowptr, csr.col, csr.values, pieces, -1)


def mean_values(csr, dtype):
    """The values the mean multiplies by (``product._mean_values``): divided by their row's count
    in float32, rounded once to ``dtype``."""
    counts = (csr.rowptr[1:] - csr.rowptr[:-1]).long()
    scale = torch.repeat_interleave(1.0 / counts.clamp(min=1).float(), counts)
    return (csr.values.float() * scale).to(dtype)


def dx_reference(a, grad_y, reduce):
    """float64 A^T grad_y (of the mean's values for "mean") and A^T's CSR of the values used."""
    csr = a.csr
    values = mean_values(csr, csr.values.dtype) if reduce == "mean" else csr.values
    r, c = csr.row_indices().long(), csr.col.long()
    return reference(c, r, values, grad_y, csr.num_cols), from_coo(c, r, values, csr.num_cols, csr.num_rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [3, 64])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_first_backward_scatters_and_the_second_takes_the_transpose(reorder, reduce, n, dtype):
    """dX of a product on the rows path: scattered at the matrix's first backward pass (hub rows by
    their pieces, a reordered matrix's rows through its row map), by the transpose, then built and
    kept, at the second; both equal the float64 reference, so each other."""
    m = 6000
    row, col, values = graph_coo(m, m)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, m), reorder=reorder).to(dtype)
    s = a._structure
    assert (ENGINES["rows"].indices(s, dtype).row_map is not None) == (reorder != "none")
    x = torch.randn(m, n, device="cuda").to(dtype).requires_grad_()
    grad_y = torch.randn(m, n, device="cuda").to(dtype)
    ref, transpose = dx_reference(a, grad_y, reduce)
    limit = scatter_tolerance(transpose, grad_y, ref)
    grads = []
    for scattered in (True, False):
        x.grad = None
        y = a.matmul(x, path="rows", reduce=reduce)
        poison(m * n + 1)
        y.backward(grad_y)
        assert (s.linked_transpose() is None) == scattered
        err = relative_error(x.grad, ref)
        assert err <= limit, f"relative error {err:.3g} over {limit:.3g} (scattered: {scattered})"
        grads.append(x.grad)
    assert relative_error(grads[0], grads[1].double()) <= 2 * limit


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic_mode_takes_the_transpose_bitwise(dtype):
    """Deterministic mode never scatters (its atomics add in any order): the first backward pass
    of each of two equal matrices (CSR only, as sampled blocks) builds the transpose, and their
    gradients agree bit for bit."""
    m, k, n = 3000, 20_000, 32
    row, col, values = graph_coo(m, k)
    # The COO's duplicate entries are summed by atomics when a matrix is built: both matrices
    # come from one built matrix's CSR, which has none, so that they hold the same bits.
    built = TCSparseTensor.from_batch(torch.stack([col, row]), values.to(dtype), num_nodes=(k, m))
    crow = built.crow_indices().long()
    rows = torch.repeat_interleave(torch.arange(m, device="cuda"), crow[1:] - crow[:-1])
    edges = torch.stack([built.col_indices().long(), rows])
    matrices = [TCSparseTensor.from_batch(edges, built.values(), num_nodes=(k, m)) for _ in range(2)]
    x = torch.randn(k, n, device="cuda").to(dtype)
    grad_y = torch.randn(m, n, device="cuda").to(dtype)
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for a in matrices:
            xg = x.clone().requires_grad_()
            a.matmul(xg, path="rows").backward(grad_y)
            assert a._structure.linked_transpose() is not None
            grads.append(xg.grad)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(grads[0], grads[1])
    ref, transpose = dx_reference(matrices[0], grad_y, "sum")
    assert relative_error(grads[0], ref) <= scatter_tolerance(transpose, grad_y, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_block_trained_once_waits_for_no_device(reduce, dtype):
    """A sampled block's training step (``from_batch``: CSR only, multiplied once each way): its
    forward and its backward, which scatters, make no host synchronisation and build no transpose."""
    g = torch.Generator(device="cuda").manual_seed(5)
    num_sources, num_targets = 30_000, 4000
    targets = torch.arange(num_targets, device="cuda").repeat_interleave(10)
    sources = torch.randint(0, num_sources, (targets.numel(),), device="cuda", generator=g)
    sources[::7] = HUB_COLUMN  # a source most targets read
    block = TCSparseTensor.from_batch(torch.stack([sources, targets]), num_nodes=(num_sources, num_targets),
                                      dtype=dtype)
    x = torch.randn(num_sources, 64, device="cuda").to(dtype)
    with torch.no_grad():
        block.matmul(x, reduce=reduce)  # the rows indices (and the mean's values), kept by the block
    x.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = block.matmul(x, reduce=reduce)
        y.square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert block._structure.layout_pending and block._structure.linked_transpose() is None
    grad_y = (2 * y.detach().float()).to(dtype)
    ref, transpose = dx_reference(block, grad_y, reduce)
    assert relative_error(x.grad, ref) <= scatter_tolerance(transpose, grad_y, ref)
