"""GPU tests of the "rows" path (the CUDA-core CSR kernel) against a float64 reference.

Fresh random data each run, outputs poisoned with NaN first. In float32 the tolerance is a
multiple of torch's own error (torch.sparse.mm, cuSPARSE) on the same data, since both sum in
fp32; in float16/bfloat16 (matrix and X rounded to the dtype first: they are the data) a multiple
of the larger of torch's dense matmul error in that dtype and one rounding of the exact result,
all that fp32 accumulation should add (under compute-sanitizer the rounding bound alone, as in
test_kernels_16bit.py).
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, csr_rows, kernels
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.formats.csr import from_coo

from .kernel_data import (
    HUB_NNZ,
    M_GRID,
    N_GRID,
    SUBSET,
    fp32_tolerance,
    poison,
    product_tolerance,
    random_matrix,
    reference,
    relative_error,
    rounding_error,
    rows_of_lengths,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def check(m, k, n, x=None, bias=False, piece_nnz=csr_rows.PIECE_NNZ, mean_degree=8, dtype=torch.float32, coo=None,
          row_map=False, addend=False, **matrix):
    """Y = A @ x (+ bias, + addend, rows through a random row map) against the float64
    reference; A random (``random_matrix``) or the given ``coo``."""
    row, col, values = coo if coo is not None else random_matrix(m, k, mean_degree, **matrix)
    csr = from_coo(row, col, values.to(dtype), m, k)
    pieces = csr_rows.row_pieces(csr.rowptr, piece_nnz)
    x = torch.randn(k, n, device="cuda").to(dtype) if x is None else x
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    rmap = torch.randperm(m, device="cuda").int() if row_map else None
    add = torch.randn(m, n, device="cuda") if addend else None
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)  # in the CSR's row order
    ref = product
    if rmap is not None:
        ref = torch.empty_like(product)
        ref[rmap.long()] = product
    ref = ref + (b.double() if bias else 0.0) + (add.double() if addend else 0.0)
    poison(m * n * dtype.itemsize // 4 + 1)
    out = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, k, b, rmap, add)
    torch.cuda.synchronize()
    assert out.dtype == dtype
    err = relative_error(out, ref)
    if ref.norm() == 0:
        assert err == 0.0
        return out
    limit = product_tolerance(csr, x, product, ref)
    if dtype == torch.float32:
        limit = max(limit, split_sum_tolerance(csr, x, piece_nnz, ref))
    assert err <= limit, f"relative error {err:.3g} over {limit:.3g} (m={m} k={k} n={n} {dtype})"
    return out


# Row lengths of every regime the kernel maps differently: empty rows; rows packed one per slot
# of a few lanes; rows run on all slots of their warp beside shorter ones; rows split into
# pieces (longer than PIECE_NNZ = 256, or than the smaller pieces below).
REGIMES = {
    "short": [1, 2, 3, 4, 5, 6, 7, 8],
    "medium": [20, 33, 64, 100, 129, 200, 255, 256],
    "mixed": [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 31, 33, 47, 64, 100, 129, 200, 256, 257, 600, 3000],
    "hubs": [0, 1, 2, 3, 4, 5, 6, 3000],
}
ALL_N = [7, 32, 100] if SUBSET else [1, 7, 16, 32, 33, 64, 100, 128, 256, 300]


def regime_coo(regime, m, k):
    return rows_of_lengths(m, k, REGIMES[regime], hub_share=0.01 if regime == "hubs" else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("m", M_GRID)
def test_shape_grid(m, n, dtype):
    check(m, m, n, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1000, 5000), (5000, 300), (33, 1)])
def test_rectangular(shape, dtype):
    check(shape[0], shape[1], 64, dtype=dtype)
    check(shape[0], shape[1], 13, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 32] if SUBSET else [7, 32, 48, 128, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_hub_row_split_into_pieces(n, bias, dtype):
    """One row of 100,000+ nonzeros: hundreds of pieces summed with fp32 atomics, the last piece
    rounding the sum into Y with the bias."""
    k = HUB_NNZ + 1000
    check(2000, k, n, bias=bias, mean_degree=4, hub_row=1234, hub_nnz=HUB_NNZ, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_sums_stay_zero_between_calls(dtype):
    """The split rows' sums and counts are kept per stream and left zero by every call, which
    saves a memset per product: a sum left over would add a whole product to the next one.
    Matrices of more split rows and wider N than any before (the buffers grow), narrower ones,
    both ways of rounding the sums (by the last piece of a row up to 2^18 pieces x N, by a
    finishing kernel beyond), a side stream, and a CUDA graph replayed while eager calls run on
    the stream it was captured on."""
    for n, m in [(32, 3000), (300, 3000), (7, 500), (300, 6000), (64, 200)]:
        check(m, 2000, n, piece_nnz=5, mean_degree=6, dtype=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for n in (48, 7):
            check(3000, 2000, n, bias=True, piece_nnz=5, mean_degree=6, dtype=dtype)
    torch.cuda.current_stream().wait_stream(side)

    row, col, values = random_matrix(3000, 2000, 6)
    csr = from_coo(row, col, values.to(dtype), 3000, 2000)
    pieces = csr_rows.row_pieces(csr.rowptr, 5)
    x = torch.randn(2000, 64, device="cuda").to(dtype)
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, 3000)
    limit = product_tolerance(csr, x, product, product)
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 2000)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 2000)
    for _ in range(3):
        graph.replay()
        with torch.cuda.stream(side):
            eager = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 2000)
        torch.cuda.synchronize()
        assert relative_error(captured, product) <= limit
        assert relative_error(eager, product) <= limit


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 47, 64, 256])
def test_bias_on_every_row(n, dtype):
    check(3000, 2000, n, bias=True, piece_nnz=5, mean_degree=6, dtype=dtype)  # split and whole rows alike


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_and_transposed_x(dtype):
    k = 900
    wide = torch.randn(k, 56, device="cuda").to(dtype)
    check(700, k, 47, x=wide[:, :47], dtype=dtype)  # rows 56 apart, odd width: the scalar gathers
    check(700, k, 48, x=wide[:, :48], dtype=dtype)  # rows 56 apart, 16-byte aligned: the vector gathers
    check(700, k, 40, x=wide[:, 1:41], dtype=dtype)  # not 16-byte aligned: the scalar gathers
    check(700, k, 64, x=torch.randn(64, k, device="cuda").to(dtype).t(), dtype=dtype)  # columns not contiguous


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 32] if SUBSET else [7, 32, 128, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_reordered_matrix_runs_rows_in_its_order(n, bias, dtype):
    """A reordered matrix runs its rows in its order from a row-permuted CSR, written through the
    row map: Y in the user's order, the split hub's pieces (atomics) included."""
    m, k = 3000, HUB_NNZ + 1000
    row, col, values = random_matrix(m, k, 6, hub_row=1234, hub_nnz=HUB_NNZ)
    perm = torch.randperm(m, device="cuda")
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k), reorder=perm)
    rows = ENGINES["rows"].indices(a._structure, dtype)
    assert torch.equal(rows.row_map.long(), perm)
    assert torch.equal(rows.col, a.csr.col[rows.gather.long()])
    csr = a.csr
    x = torch.randn(k, n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)
    ref = product + (b.double() if bias else 0.0)
    poison(m * n * dtype.itemsize // 4 + 1)
    out = a.matmul(x, path="rows", bias=b)
    torch.cuda.synchronize()
    err, limit = relative_error(out, ref), product_tolerance(csr, x, product, ref)
    assert err <= limit, f"relative error {err:.3g} over {limit:.3g} (n={n} {dtype})"


def test_reordered_gradients_through_the_rows_path():
    """dX of a reordered square matrix with an unsymmetric pattern: A^T (its own structure)
    runs its rows in the same symmetric order."""
    m = k = 400
    row, col, values = random_matrix(m, k, 7)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k), reorder="degree")
    assert ENGINES["rows"].indices(a._structure, torch.float32).row_map is not None
    assert ENGINES["rows"].indices(a._structure.transposed(), torch.float32).row_map is not None
    dense = a.to_dense().double()
    x = torch.randn(k, 40, device="cuda", requires_grad=True)
    y = a.matmul(x, path="rows")
    torch.testing.assert_close(y.double(), dense @ x.detach().double(), rtol=1e-5, atol=1e-5)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    torch.testing.assert_close(x.grad.double(), dense.t() @ grad_y.double(), rtol=1e-5, atol=1e-5)


def test_repeated_calls_and_deterministic_mode():
    m, k = 3000, HUB_NNZ + 100
    row, col, values = random_matrix(m, k, 6, hub_row=7, hub_nnz=HUB_NNZ)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k))
    x = torch.randn(k, 64, device="cuda")
    ref = reference(row, col, values, x, m)
    # The unsplit hub is one warp's sum of 10^5 terms in 32 running sums; recursive summation of
    # random terms errs by about eps * sqrt(terms) relative, above cuSPARSE's tree, which was
    # still the tighter bound on most draws. Split, its pieces meet in atomics in an order that
    # changes from call to call, and so does the rounding (by a few 1e-7 relative); a
    # sum left over from the previous call would be off by the whole product.
    bound = max(fp32_tolerance(a.csr, x, ref), 4 * 2.0**-24 * HUB_NNZ**0.5)
    first, second = a.matmul(x, path="rows"), a.matmul(x, path="rows")
    assert relative_error(first, ref) <= bound and relative_error(second, ref) <= bound
    torch.use_deterministic_algorithms(True)
    try:
        one, two = a.matmul(x, path="rows"), a.matmul(x, path="rows")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(one, two)
    assert relative_error(one, ref) <= bound


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16bit_product_gradient_and_deterministic_mode(dtype):
    """A 16-bit matrix times 16-bit X, and dX (scattered: the matrix's first backward pass), both
    in the dtype with fp32 sums: a 10^5-nonzero hub row split into pieces (summed in fp32, rounded
    once) in the product, its pieces' adds spread over dX; unsplit and bitwise repeatable when
    deterministic."""
    m, k = 3000, HUB_NNZ + 100
    row, col, values = random_matrix(m, k, 6, hub_row=7, hub_nnz=HUB_NNZ)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k)).to(dtype)
    csr = a.csr
    r, c = csr.row_indices().long(), csr.col.long()
    x = torch.randn(k, 40, device="cuda").to(dtype).requires_grad_()
    y = a.matmul(x, path="rows")
    ref = reference(r, c, csr.values, x.detach(), m)
    assert y.dtype == dtype
    assert relative_error(y, ref) <= 4 * rounding_error(ref, dtype) + 1e-6
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    ref_dx = reference(c, r, csr.values, grad_y, k)
    assert x.grad.dtype == dtype
    assert relative_error(x.grad, ref_dx) <= 4 * rounding_error(ref_dx, dtype) + 1e-6
    torch.use_deterministic_algorithms(True)
    try:
        one, two = a.matmul(x.detach(), path="rows"), a.matmul(x.detach(), path="rows")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(one, two)
    assert relative_error(one, ref) <= 4 * rounding_error(ref, dtype) + 1e-6


@pytest.mark.parametrize("symmetric", [True, False])
def test_gradients_through_the_rows_path(symmetric):
    m = 500
    row, col, values = random_matrix(m, m, 7)
    if symmetric:
        row, col, values = torch.cat([row, col]), torch.cat([col, row]), torch.cat([values, values])
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, m))
    dense = a.to_dense().double()
    x = torch.randn(m, 33, device="cuda", requires_grad=True)
    bias = torch.randn(33, device="cuda", requires_grad=True)
    y = a.matmul(x, path="rows", bias=bias)
    assert type(y.grad_fn).__name__ == "ProductBackward"
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    torch.testing.assert_close(x.grad.double(), dense.t() @ grad_y.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias.grad, grad_y.sum(0))
    # Values with gradient: the same product, their gradient one SDDMM.
    v = a.csr.values.clone().requires_grad_()
    y = a.with_values(v).matmul(x.detach(), path="rows")
    torch.testing.assert_close(y.double(), dense @ x.detach().double(), rtol=1e-5, atol=1e-5)
    y.backward(grad_y)
    r, c = a.csr.row_indices(), a.csr.col.long()
    torch.testing.assert_close(v.grad.double(), (grad_y.double()[r] * x.detach().double()[c]).sum(1), rtol=1e-5, atol=1e-5)


def test_rejects_bad_inputs():
    row, col, values = random_matrix(100, 100, 5)
    a = TCSparseTensor.from_coo(row, col, values, shape=(100, 100))
    with pytest.raises(ValueError, match="path 'rows' needs a CUDA tensor of dtype"):
        a.double().matmul(torch.randn(100, 4, device="cuda", dtype=torch.float64), path="rows")
    csr = a.csr
    pieces = csr_rows.row_pieces(csr.rowptr)
    x = torch.randn(100, 4, device="cuda")
    with pytest.raises(RuntimeError, match="values must be Float like x, got Double"):
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values.double(), pieces, 100)
    with pytest.raises(RuntimeError, match="bias must be Half like x, got Float"):
        kernels.csr_rows_spmm(x.half(), csr.rowptr, csr.col, csr.values.half(), pieces, 100, torch.zeros(4, device="cuda"))
    with pytest.raises(RuntimeError, match="x must be float32, float16 or bfloat16, got Double"):
        kernels.csr_rows_spmm(x.double(), csr.rowptr, csr.col, csr.values.double(), pieces, 100)
    with pytest.raises(RuntimeError, match="x must be 2-D with 100 rows"):
        kernels.csr_rows_spmm(x[:50], csr.rowptr, csr.col, csr.values, pieces, 100)
    with pytest.raises(RuntimeError, match="col must be Int, got Long"):
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col.long(), csr.values, pieces, 100)
    with pytest.raises(RuntimeError, match="row_map must be 1-D with 100 entries"):
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 100, row_map=torch.arange(99, device="cuda").int())
    with pytest.raises(RuntimeError, match="row_map must be Int, got Long"):
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 100, row_map=torch.arange(100, device="cuda"))
    with pytest.raises(RuntimeError, match="bias must be 1-D with 4 entries"):
        kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, 100, torch.zeros(5, device="cuda"))


@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_values_with_gradient_keep_the_split_of_long_rows(reorder):
    """With values that need a gradient, products go through the tcsparse::spmm op: its "rows"
    path reads the split the matrix keeps (of its CSR and of the transpose's), so a call after the
    first makes no host synchronisation, and a hub split into pieces still sums right both ways."""
    m, k = 3000, HUB_NNZ + 100
    row, col, values = random_matrix(m, k, 6, hub_row=7, hub_nnz=HUB_NNZ)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k), reorder=reorder)
    csr = a.csr
    r, c = csr.row_indices().long(), csr.col.long()
    v = csr.values.clone().requires_grad_()
    weighted = a.with_values(v)
    x = torch.randn(k, 40, device="cuda", requires_grad=True)
    weighted.matmul(x, path="rows").sum().backward()  # builds and keeps the splits
    x.grad = v.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = weighted.matmul(x, path="rows")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = reference(r, c, csr.values, x.detach(), m)
    assert relative_error(y, ref) <= fp32_tolerance(csr, x.detach(), ref)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    ref_dx = reference(c, r, csr.values, grad_y, k)
    assert relative_error(x.grad, ref_dx) <= 1e-5
    ref_dv = (grad_y.double()[r] * x.detach().double()[c]).sum(1)
    assert relative_error(v.grad, ref_dv) <= 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", ALL_N)
@pytest.mark.parametrize("regime", list(REGIMES))
def test_every_row_length_regime(regime, n, dtype):
    """Rows of every length regime, split at the large graphs' piece size, at a small graph's, and
    not at all (deterministic mode): every output written once with the right sum."""
    m = 1000 if regime in ("mixed", "medium") else 4000
    coo = regime_coo(regime, m, 3000)
    for piece_nnz in (csr_rows.PIECE_NNZ, 32, csr_rows.UNSPLIT):
        check(m, 3000, n, piece_nnz=piece_nnz, dtype=dtype, coo=coo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 32, 64] if SUBSET else [1, 7, 32, 33, 64, 128, 300])
@pytest.mark.parametrize("piece_nnz", [5, csr_rows.PIECE_NNZ, csr_rows.UNSPLIT])
def test_bias_row_map_and_addend(piece_nnz, n, dtype):
    """The bias and an fp32 addend (another kernel's sums) added before the one rounding, rows
    written through a row map: in packed rows, rows on all slots, and split rows rounded by their
    last piece (or, with pieces of 5, by the finishing kernel on wide N)."""
    coo = regime_coo("mixed", 800, 2000)
    check(800, 2000, n, bias=True, row_map=True, addend=True, piece_nnz=piece_nnz, dtype=dtype, coo=coo)


# (row stride - N, first column): the widest load that the row stride and the base allow is 16,
# 8, 4 bytes or one element in turn, in every dtype.
SLICES = [(0, 0), (8, 0), (8, 4), (4, 2), (2, 1), (9, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 32, 100] if SUBSET else ALL_N)
@pytest.mark.parametrize("pad, first", SLICES)
def test_x_slices_of_every_alignment(pad, first, n, dtype):
    """X a column slice of a wider matrix (any row stride, base not 16-byte aligned): loads as wide
    as the stride and the base allow, on short, all-slot and split rows."""
    k = 2500
    wide = torch.randn(k, n + pad, device="cuda").to(dtype)
    x = wide[:, first:first + n]
    check(1000, k, n, x=x, bias=True, piece_nnz=64, dtype=dtype, coo=regime_coo("mixed", 1000, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [32, 300] if SUBSET else [1, 7, 32, 33, 64, 100, 128, 256, 300])
def test_unsplit_rows_are_bitwise_repeatable(n, dtype):
    """Without split rows (deterministic mode) every output is one warp's sum in an order fixed by
    the matrix and N: the same bits from call to call, other products in between."""
    k = HUB_NNZ + 1000
    row, col, values = regime_coo("mixed", 2000, k)
    hub = torch.randperm(k, device="cuda")[:HUB_NNZ]
    row = torch.cat([row, torch.full_like(hub, 77)])
    col = torch.cat([col, hub])
    values = torch.cat([values, torch.randn(HUB_NNZ, device="cuda")])
    csr = from_coo(row, col, values.to(dtype), 2000, k)
    pieces = csr_rows.row_pieces(csr.rowptr, csr_rows.UNSPLIT)
    x = torch.randn(k, n, device="cuda").to(dtype)
    first = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, k)
    kernels.csr_rows_spmm(torch.randn(k, 48, device="cuda").to(dtype), csr.rowptr, csr.col, csr.values,
                csr_rows.row_pieces(csr.rowptr, 16), k)
    second = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, k)
    assert torch.equal(first, second)
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, 2000)
    bound = max(product_tolerance(csr, x, product, product), 4 * 2.0**-24 * HUB_NNZ**0.5)
    assert relative_error(first, product) <= bound


# Padded splits (csr_rows.padded_row_pieces): sized by bounds from nnz where the longest row is
# unknown, their tails of padding skipped by the kernel. Hubs of 10,000 nonzeros among empty and
# short rows; N from one column to past a tile.
PADDED_LENGTHS = [0, 0, 1, 3, 8, 33, 40, 70, 300, 10_000]


def padded_and_exact(m, k, piece_nnz, dtype, lengths=PADDED_LENGTHS, hub_share=0.01):
    row, col, values = rows_of_lengths(m, k, lengths, hub_share=hub_share)
    csr = from_coo(row, col, values.to(dtype), m, k)
    exact = csr_rows.row_pieces(csr.rowptr, piece_nnz)
    padded = csr_rows.row_pieces(csr.rowptr, piece_nnz, None, csr.nnz)
    assert padded.piece_slots.numel() > exact.piece_slots.numel() > 0  # padding to skip, rows to split
    assert padded.split_rows.numel() > exact.split_rows.numel()
    return csr, exact, padded


def checked_product(csr, pieces, x, b=None, rmap=None, add=None):
    """The kernel's product by ``pieces`` against the float64 reference (poisoned output first)."""
    m, k = csr.num_rows, csr.num_cols
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)
    ref = product
    if rmap is not None:
        ref = torch.empty_like(product)
        ref[rmap.long()] = product
    ref = ref + (b.double() if b is not None else 0.0) + (add.double() if add is not None else 0.0)
    poison(m * x.shape[1] * x.dtype.itemsize // 4 + 1)
    out = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, k, b, rmap, add)
    torch.cuda.synchronize()
    err, limit = relative_error(out, ref), product_tolerance(csr, x, product, ref)
    if x.dtype == torch.float32:
        limit = max(limit, split_sum_tolerance(csr, x, pieces.piece_nnz, ref))
    assert err <= limit, f"relative error {err:.3g} over {limit:.3g} (n={x.shape[1]} {x.dtype})"
    return out


def split_sum_tolerance(csr, x, piece_nnz, ref):
    """float32 error of rows summed in order, as pieces of ``piece_nnz`` whose sums add by atomics
    in any order: a row of d nonzeros takes d roundings whole, about piece_nnz + d / piece_nnz
    split, each at most half an ulp of the absolute sum |A| |x| (4 x the random-walk size, as
    torch's tolerance is 4 x its error). A hub row of thousands of nonzeros, whole or at the tiny
    pieces of these tests, takes more roundings than torch's own sum of it."""
    longest = int((csr.rowptr[1:] - csr.rowptr[:-1]).max())
    absolute = reference(csr.row_indices().long(), csr.col.long(), csr.values.abs(), x.abs(), csr.num_rows)
    roundings = longest if longest <= piece_nnz else piece_nnz + -(-longest // piece_nnz)
    return float(4 * 2.0**-24 * roundings**0.5 * absolute.norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 32, 128, 257])
@pytest.mark.parametrize("piece_nnz", [32, 256])
def test_padded_split_equals_the_exact_split(piece_nnz, n, dtype):
    """Every n takes its own launch shape; the pieces' sums are rounded by the last piece of a row
    at small pieces x N, by the finishing kernel (over padded split rows too) beyond."""
    csr, exact, padded = padded_and_exact(3000, 20_000, piece_nnz, dtype)
    x = torch.randn(20_000, n, device="cuda").to(dtype)
    ours = checked_product(csr, padded, x)
    theirs = checked_product(csr, exact, x)
    product = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, 3000)
    # Each within the tolerance of the exact product, so within about twice of each other.
    assert relative_error(ours, theirs.double()) <= 2.5 * product_tolerance(csr, x, product, product)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 32, 128, 257])
def test_padded_split_with_bias_row_map_and_addend(n, dtype):
    csr, _, padded = padded_and_exact(1500, 12_000, 32, dtype)
    x = torch.randn(12_000, n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    rmap = torch.randperm(1500, device="cuda").int()
    checked_product(csr, padded, x, b, rmap, torch.randn(1500, n, device="cuda"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_split_sums_stay_zero_between_calls(dtype):
    """Padded and exact splits of several matrices share the per-stream sums, grown to the padded
    bounds: each call leaves its real rows' sums zero and never touches the padding's, both ways
    of rounding (small and large pieces x N)."""
    for m, n, piece_nnz in [(3000, 300, 32), (800, 1, 5), (3000, 7, 32), (400, 64, 256), (3000, 257, 5)]:
        csr, exact, padded = padded_and_exact(m, 15_000, piece_nnz, dtype, hub_share=0.02)
        x = torch.randn(15_000, n, device="cuda").to(dtype)
        for pieces in (padded, exact, padded):
            checked_product(csr, pieces, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padding_only_splits_write_every_row(dtype):
    """Enough nonzeros for a split row but none split: every piece and split row is padding."""
    row, col, values = rows_of_lengths(2000, 5000, [0, 1, 16, 32])
    csr = from_coo(row, col, values.to(dtype), 2000, 5000)
    padded = csr_rows.row_pieces(csr.rowptr, 32, None, csr.nnz)
    assert padded.piece_starts.numel() > 0 and bool((padded.piece_starts == csr_rows.PADDING).all())
    for n in (1, 32, 257):
        checked_product(csr, padded, torch.randn(5000, n, device="cuda").to(dtype))


def batch_matrix_with_hub_columns(dtype, num_targets=20_000, num_sources=5000):
    """A CSR-only matrix (``from_batch``: the longest row of its transpose unknown) whose
    transpose holds rows of 10,000 nonzeros (sources every target reads), empty rows (sources
    no target reads) and short ones."""
    g = torch.Generator(device="cuda").manual_seed(11)
    targets = torch.randint(0, num_targets, (8 * num_targets,), device="cuda", generator=g)
    sources = torch.randint(100, num_sources, (targets.numel(),), device="cuda", generator=g)
    hubs = torch.arange(3, device="cuda").repeat_interleave(10_000)
    hub_targets = torch.cat([torch.randperm(num_targets, device="cuda", generator=g)[:10_000] for _ in range(3)])
    edges = torch.stack([torch.cat([sources, hubs]), torch.cat([targets, hub_targets])])
    weights = torch.randn(edges.shape[1], device="cuda", generator=g).to(dtype)
    return TCSparseTensor.from_batch(edges, weights, num_nodes=(num_sources, num_targets))


@pytest.mark.parametrize("n", [1, 32, 128, 257])
def test_backward_through_a_padded_transpose(n):
    """dX = A^T dY of a CSR-only matrix in float32 (its products run the rows path until its
    layout pays): its first backward pass scatters from the forward's operands, the second builds
    the transpose, which splits its hub rows by a padded split."""
    a = batch_matrix_with_hub_columns(torch.float32)
    csr = a.csr
    r, c = csr.row_indices().long(), csr.col.long()
    x = torch.randn(a.size(1), n, device="cuda", requires_grad=True)
    for scattered in (True, False):
        x.grad = None
        y = a.matmul(x)
        grad_y = torch.randn_like(y)
        poison(a.size(1) * n + 1)
        y.backward(grad_y)
        assert (a._structure.linked_transpose() is None) == scattered
        ref = reference(c, r, csr.values, grad_y, a.size(1))
        assert relative_error(x.grad, ref) <= 4 * max(2.0**-24 * 10_000**0.5, 2.0**-24) + 1e-6
    assert a._structure.linked_transpose().known_max_row_nnz() is None  # the split was sized by bounds, not read


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_split_in_deterministic_mode_is_bitwise_repeatable(dtype):
    """No row is split in deterministic mode: the padded split of UNSPLIT is empty, and the
    gradients through a CSR-only matrix's transpose repeat bit for bit."""
    row, col, values = rows_of_lengths(3000, 20_000, PADDED_LENGTHS, hub_share=0.01)
    csr = from_coo(row, col, values.to(dtype), 3000, 20_000)
    pieces = csr_rows.row_pieces(csr.rowptr, csr_rows.UNSPLIT, None, csr.nnz)
    assert all(t.numel() == 0 for t in pieces[:3])
    x = torch.randn(20_000, 32, device="cuda").to(dtype)
    assert torch.equal(checked_product(csr, pieces, x), checked_product(csr, pieces, x))
    a = batch_matrix_with_hub_columns(dtype)
    x = torch.randn(a.size(1), 32, device="cuda").to(dtype)
    grad_y = torch.randn(a.size(0), 32, device="cuda").to(dtype)
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            xg = x.clone().requires_grad_()
            a.matmul(xg).backward(grad_y)
            grads.append(xg.grad)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(grads[0], grads[1])
    c = a.csr
    ref = reference(c.col.long(), c.row_indices().long(), c.values, grad_y, a.size(1))
    assert relative_error(grads[0], ref) <= 4 * max(rounding_error(ref, dtype), 2.0**-24 * 10_000**0.5) + 1e-6
