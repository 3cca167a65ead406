"""GPU tests of the "grouped" path (the Tensor-Core kernel on the grouped layout) against float64.

Fresh random data each run, outputs poisoned with NaN first (a 16-bit Y where every group is one
chunk is not zeroed before the kernel: every row is written by a warp, so an unwritten entry
fails). float32 runs TF32 (tolerance a
multiple of torch's own TF32 matmul error on the same data) or, with TF32 off, the 3xTF32 split
(a multiple of torch.sparse's fp32 error); float16/bfloat16 take the matrix and X rounded to the
dtype and the tolerance of test_kernels_16bit.py.
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, _ext, csr_rows, kernels
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.engines.grouped import grouped_layout
from torch_tcsparse.formats import grouped as grouped_format
from torch_tcsparse.formats.grouped import build_grouped, fragment_index, fragment_values

from .kernel_data import (
    HUB_NNZ,
    M_GRID,
    N_GRID,
    SUBSET,
    half_tolerance,
    poison,
    random_matrix,
    reference,
    relative_error,
    rounding_error,
    tf32_tolerance,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def tf32():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(previous)


@pytest.fixture
def split_at(monkeypatch):
    """Forces the grouped layout's split: pairs of a group and a column with fewer nonzeros than
    the threshold go to the rows kernel (the ``rest``), whatever the selector would price."""

    def force(threshold):
        monkeypatch.setattr(grouped_format, "SPLIT_THRESHOLDS", (threshold,))

    return force


def tolerance(csr, x, product, ref):
    if x.dtype != torch.float32:
        return half_tolerance(csr, x, product, ref)
    return tf32_tolerance(csr.row_indices(), csr.col.long(), csr.values, x, csr.num_rows, product)


def check(m, k, n, dtype=torch.float32, mean_degree=8, bias=False, reorder="none", x=None, rest=False, **matrix):
    row, col, values = random_matrix(m, k, mean_degree, **matrix)
    return check_matrix(row, col, values, (m, k), n, dtype, bias, reorder, x, rest)


def check_matrix(row, col, values, shape, n, dtype=torch.float32, bias=False, reorder="none", x=None, rest=False):
    """The grouped product of the COO matrix (row, col, values) against float64; the tensor."""
    m, k = shape
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=shape, reorder=reorder)
    if rest:
        assert grouped_layout(a._structure).rest_nnz > 0
    csr = a.csr
    x = torch.randn(k, n, device="cuda").to(dtype) if x is None else x
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)
    ref = product + (b.double() if bias else 0.0)
    poison(m * n + 1)
    out = a.matmul(x, path="grouped", bias=b)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == (m, n)
    check_error(out, ref, tolerance(csr, x, product, ref), f"m={m} k={k} n={n} {dtype}")
    return a


def check_error(out, ref, limit, what):
    err = relative_error(out, ref)
    if ref.norm() == 0:
        assert err == 0.0
        return
    assert err <= limit, f"relative error {err:.3g} over {limit:.3g} ({what})"


def band_coo(m, width):
    """A band matrix: row i holds columns i - width .. i + width, randn values."""
    row = torch.arange(m, device="cuda").repeat_interleave(2 * width + 1)
    col = row + torch.arange(-width, width + 1, device="cuda").repeat(m)
    keep = (col >= 0) & (col < m)
    return row[keep], col[keep], torch.randn(int(keep.sum()), device="cuda")


def mixed_coo(m, k, scattered=0):
    """An m x k matrix (k >= m) with groups of every kind: rows 0..63 of ~600 nonzeros each (one group of hundreds of blocks,
    many chunks adding atomically), rows 64..191 empty (two groups of one chunk of no block),
    then a band (groups of one chunk), the last group partial; plus ``scattered`` random
    nonzeros on band rows, pairs of one nonzero that a split leaves to the rest."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(torch.randint(0, 2**31, (1,))))
    dense_row = torch.arange(64, device="cuda").repeat_interleave(600)
    dense_col = torch.randint(0, k, (dense_row.numel(),), device="cuda", generator=gen)
    band_row, band_col, _ = band_coo(m, 8)
    on_band = band_row >= 192
    extra_row = torch.randint(192, m, (scattered,), device="cuda", generator=gen)
    extra_col = torch.randint(0, k, (scattered,), device="cuda", generator=gen)
    row = torch.cat([dense_row, band_row[on_band], extra_row])
    col = torch.cat([dense_col, band_col[on_band], extra_col])
    return row, col, torch.randn(row.numel(), device="cuda", generator=gen)


def chunks_per_group(layout):
    return torch.bincount(layout.chunk_group.long()).tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("m", M_GRID)
def test_shape_grid(tf32, m, n, dtype):
    check(m, m, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 128])
def test_dense_groups_many_chunks(tf32, n, dtype):
    """Rows of ~600 nonzeros among 3,000 columns: every group spans hundreds of blocks, cut into
    chunks whose sums meet in the atomics, and sub-blocks of all occupancies."""
    check(700, 3000, n, dtype, mean_degree=600, empty_fraction=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [32] if SUBSET else [7, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_hub_row_bias_and_reordering(tf32, n, bias, dtype):
    """A 10^5-nonzero hub (one group of thousands of blocks), the bias added once, rows in a
    reordering's order written through the row map."""
    check(2000, HUB_NNZ + 1000, n, dtype, mean_degree=6, bias=bias, hub_row=1234, hub_nnz=HUB_NNZ)
    check(1500, 1500, n, dtype, mean_degree=40, bias=bias, reorder=torch.randperm(1500, device="cuda"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rectangular_and_strided_x(tf32, dtype):
    check(1000, 5000, 64, dtype)
    check(5000, 300, 13, dtype)
    check(1000, 1000, 36, dtype)  # a multiple of 4, not of 8: whole copies, the last step half used
    wide = torch.randn(900, 56, device="cuda").to(dtype)
    check(700, 900, 40, dtype, x=wide[:, 1:41])  # not 16-byte aligned: the element copies
    check(700, 900, 64, dtype, x=torch.randn(64, 900, device="cuda").to(dtype).t())


# N: odd, under a piece, a multiple of 8 ending inside a 32-column slice (whole copies, a partial
# slice), a multiple of 32, and even but no multiple of 4 or 8 (element copies).
EPILOGUE_N = [7, 40, 130] if SUBSET else [1, 7, 40, 104, 128, 130]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", EPILOGUE_N)
@pytest.mark.parametrize("bias", [False, True])
def test_single_chunk_groups_store_y(tf32, split_at, n, bias, dtype):
    """A band matrix: every group is one chunk, so for 16-bit Y the binding allocates Y alone,
    neither zeroed nor filled, and each warp stores its rows in Y's dtype with the bias (float32:
    atomics into zeroed rows); the last group is partial (rows past the end skipped). Then with
    its 64-row pieces shuffled and reversed, so that the stores go through a row map, and groups
    still span few columns."""
    split_at(1)
    m = 1000
    pieces = torch.arange(m, device="cuda").split(64)
    order = torch.cat([pieces[i].flip(0) for i in torch.randperm(len(pieces)).tolist()])
    for reorder in ("none", order):
        a = check_matrix(*band_coo(m, 8), (m, m), n, dtype, bias, reorder=reorder)
        layout = grouped_layout(a._structure)
        assert layout.rest is None and chunks_per_group(layout) == [1] * 16
    row, col, values = band_coo(m, 8)
    kept = row >= 128  # groups 0 and 1 empty: their chunk of no block writes zeros (or the bias)
    a = check_matrix(row[kept], col[kept], values[kept], (m, m), n, dtype, bias)
    assert chunks_per_group(grouped_layout(a._structure)) == [1] * 16


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", EPILOGUE_N)
@pytest.mark.parametrize("bias", [False, True])
def test_mixed_and_empty_groups(tf32, split_at, n, bias, dtype):
    """A group of many chunks (fp32 atomics into zeroed sums, then rounded), empty groups (a chunk
    of no block) and groups of one chunk in one layout; then the same through the rest (pairs of
    one nonzero to the rows kernel, which adds the kernel's fp32 sums, keep_fp32, before rounding
    once)."""
    split_at(1)
    m, k = 1000, 3000
    a = check_matrix(*mixed_coo(m, k), (m, k), n, dtype, bias)
    layout = grouped_layout(a._structure)
    per_group = chunks_per_group(layout)
    sizes = (layout.chunk_starts[1:] - layout.chunk_starts[:-1]).tolist()
    assert layout.rest is None and per_group[0] > 1 and set(per_group[1:]) == {1}
    chunk_group = layout.chunk_group.tolist()
    assert [sizes[chunk_group.index(g)] for g in (1, 2)] == [0, 0]
    split_at(2)
    a = check_matrix(*mixed_coo(m, k, scattered=500), (m, k), n, dtype, bias, rest=True)
    assert chunks_per_group(grouped_layout(a._structure))[0] > 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_keep_fp32_output(tf32, split_at, bias, dtype):
    """The binding's fp32 output (keep_fp32) on a layout of every kind of group, with a bias:
    every chunk adds into it from the bias."""
    split_at(1)
    m, k, n = 1000, 3000, 40
    row, col, values = mixed_coo(m, k)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k))
    indices = ENGINES["grouped"].indices(a._structure, dtype)
    layout = indices.layout
    _, fragments, _ = ENGINES["grouped"].operands(indices, a.csr.values)
    x = torch.randn(k, n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    csr = a.csr
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)
    ref = product + (b.double() if bias else 0.0)
    poison(m * n + 1)
    out = _ext.load().grouped_spmm(x, fragments, *layout.kernel_arrays(), m, False, b, True)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    check_error(out, ref, tolerance(csr, x, product, ref), f"keep_fp32 {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 32, 160] if SUBSET else [1, 7, 13, 32, 128, 160, 512])
@pytest.mark.parametrize("m", M_GRID)
def test_split_shape_grid(tf32, split_at, m, n, dtype):
    """Pairs of fewer than 4 nonzeros through the rows kernel, which adds the Tensor-Core sums
    before rounding. At M = 1000 both parts hold nonzeros; at M = 65537 no pair reaches 4 and
    the layout has no block (each group's one chunk writes zero sums)."""
    split_at(4)
    check(m, m, n, dtype, mean_degree=min(m, 40), rest=m >= 64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [32] if SUBSET else [7, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_split_hub_bias_reordering_strided(tf32, split_at, n, bias, dtype):
    """A hub whose pairs hold one nonzero each lands in the rest, split into pieces summed with
    atomics on top of the sums; the bias once; a reordered matrix's rest in its order; X strided."""
    split_at(2)
    check(2000, HUB_NNZ + 1000, n, dtype, mean_degree=30, bias=bias, hub_row=1234, hub_nnz=HUB_NNZ, rest=True)
    check(1500, 1500, n, dtype, mean_degree=40, bias=bias, reorder=torch.randperm(1500, device="cuda"), rest=True)
    wide = torch.randn(900, n + 16, device="cuda").to(dtype)
    check(700, 900, n, dtype, mean_degree=60, bias=bias, x=wide[:, 1:n + 1], rest=True)


def test_rows_binding_checks_the_addend():
    row, col, values = random_matrix(100, 100, 5)
    a = TCSparseTensor.from_coo(row, col, values, shape=(100, 100))
    s = a._structure
    pieces = csr_rows.row_pieces(s.rowptr, 256)
    x = torch.randn(100, 8, device="cuda")
    kernels = _ext.load()
    args = (x, s.rowptr, s.col, a.csr.values, *pieces[:3], 100, 256, None, None)
    with pytest.raises(RuntimeError, match="addend must be float32"):
        kernels.csr_rows_spmm(*args, torch.zeros(100, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"addend must have shape \[100, 8\]"):
        kernels.csr_rows_spmm(*args, torch.zeros(99, 8, device="cuda"))
    addend = torch.randn(100, 8, device="cuda")
    assert torch.allclose(kernels.csr_rows_spmm(*args, addend), kernels.csr_rows_spmm(*args, None) + addend, atol=1e-5)


def test_exact_fp32_without_tf32():
    """TF32 off: the 3xTF32 split, close to fp32 (well under TF32's 1e-4..1e-3)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        row, col, values = random_matrix(1000, 1000, 200)
        a = TCSparseTensor.from_coo(row, col, values, shape=(1000, 1000))
        x = torch.randn(1000, 64, device="cuda")
        ref = reference(row, col, values, x, 1000)
        assert relative_error(a.matmul(x, path="grouped"), ref) <= 1e-5
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize("split", [1, 4])
def test_gradients_and_deterministic_mode(tf32, split_at, split):
    """dX through the transpose's grouped layout (unsplit, or split with a rest); values needing
    a gradient and deterministic mode run base instead (the same product, no atomics)."""
    split_at(split)
    m = 600
    row, col, values = random_matrix(m, m, 50)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, m))
    dense = a.to_dense().double()
    x = torch.randn(m, 32, device="cuda", requires_grad=True)
    y = a.matmul(x, path="grouped")
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    assert (grouped_layout(a._structure).rest_nnz > 0) == (split > 1)
    assert relative_error(y, dense @ x.detach().double()) <= 1e-3
    assert relative_error(x.grad, dense.t() @ grad_y.double()) <= 1e-3
    edge_values = a.csr.values.clone().requires_grad_()
    a.with_values(edge_values).matmul(x.detach(), path="grouped").sum().backward()
    assert edge_values.grad is not None
    torch.use_deterministic_algorithms(True)
    try:
        one, two = a.matmul(x.detach(), path="grouped"), a.matmul(x.detach(), path="grouped")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(one, two)
    assert relative_error(one, dense @ x.detach().double()) <= 1e-3


def test_16bit_rounding_bound():
    row, col, values = random_matrix(3000, 3000, 100)
    a = TCSparseTensor.from_coo(row, col, values, shape=(3000, 3000)).half()
    csr = a.csr
    x = torch.randn(3000, 64, device="cuda").half()
    ref = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, 3000)
    assert relative_error(a.matmul(x, path="grouped"), ref) <= 4 * rounding_error(ref, torch.float16) + 1e-6


def test_binding_rejects_bad_inputs():
    row, col, values = random_matrix(100, 100, 5)
    a = TCSparseTensor.from_coo(row, col, values, shape=(100, 100))
    layout = grouped_layout(a._structure)
    fragments = fragment_values(layout, fragment_index(layout, 4), a.csr.values)
    x = torch.randn(100, 8, device="cuda")
    with pytest.raises(RuntimeError, match="fragments must have x's dtype Half, got Float"):
        kernels.grouped_spmm(x.half(), fragments, layout.kernel_arrays(), layout.num_rows, None, False)
    with pytest.raises(RuntimeError, match="fragments must be 1-D and contiguous with a multiple of 128"):
        kernels.grouped_spmm(x, fragments[:-1], layout.kernel_arrays(), layout.num_rows, None, False)
    with pytest.raises(RuntimeError, match="x must be float32, float16 or bfloat16"):
        kernels.grouped_spmm(x.double(), fragments.double(), layout.kernel_arrays(), layout.num_rows, None, False)
    with pytest.raises(RuntimeError, match="bias must be"):
        kernels.grouped_spmm(x, fragments, layout.kernel_arrays(), layout.num_rows, torch.zeros(9, device="cuda"), False)
    short = layout._replace(row_map=layout.row_map[:-1])
    with pytest.raises(RuntimeError, match="row_map must be 1-D with"):
        kernels.grouped_spmm(x, fragments, short.kernel_arrays(), short.num_rows, None, False)
    short = layout._replace(sub_slots=layout.sub_slots[:-1])
    with pytest.raises(RuntimeError, match="sub_slots must be 1-D with"):
        kernels.grouped_spmm(x, fragments, short.kernel_arrays(), short.num_rows, None, False)


def test_selector_offers_grouped_on_dense_matrices_only():
    dense_rows = random_matrix(2000, 2000, 400)
    dense = TCSparseTensor.from_coo(*dense_rows[:2], dense_rows[2], shape=(2000, 2000))
    layout = grouped_layout(dense._structure)
    assert dense._structure.grouped_size() == (layout.num_blocks, layout.rest_nnz, layout.one_chunk_per_group)
    assert layout.num_blocks <= build_grouped(dense._structure.rowptr, dense._structure.col, 2000, 2000).num_blocks
    assert "grouped" in dense.explain(128).candidates
    sparse_rows = random_matrix(20000, 20000, 4)
    sparse = TCSparseTensor.from_coo(*sparse_rows[:2], sparse_rows[2], shape=(20000, 20000))
    assert sparse._structure.grouped_size() is None
    assert "grouped" not in sparse.explain(128).candidates
