"""Random inputs, float64 references and checks shared by the GPU kernel tests."""
import os

import torch

from torch_tcsparse import kernels

# Under compute-sanitizer (TCSPARSE_SANITIZER_SUBSET=1) the tests run a representative subset.
SUBSET = os.environ.get("TCSPARSE_SANITIZER_SUBSET") == "1"
M_GRID = [17, 1000] if SUBSET else [1, 15, 16, 17, 1000, 65537]
N_GRID = [7, 32, 160] if SUBSET else [1, 7, 8, 13, 32, 64, 96, 128, 160, 256, 512]
KERNELS = ["base", "balanced"]
HUB_NNZ = 30_000 if SUBSET else 150_000
# Rows of a matrix whose windows of several balanced chunks outnumber the resident warps enough
# that warp range boundaries cut some windows in one column slice and not in another.
CUT_ROWS = 8000 if SUBSET else 20000
CUT_N = [200] if SUBSET else [128, 200]


def random_matrix(m, k, mean_degree, empty_fraction=0.1, hub_row=None, hub_nnz=0, seed=None):
    """COO of an m x k matrix: random columns, randn values, some empty rows, optional hub row."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, (1,))))
    nnz = m * mean_degree
    row = torch.randint(0, m, (nnz,), device="cuda", generator=gen)
    empty = torch.rand(m, device="cuda", generator=gen) < empty_fraction
    row = row[~empty[row]]
    col = torch.randint(0, k, (row.numel(),), device="cuda", generator=gen)
    if hub_row is not None:
        row = torch.cat([row, torch.full((hub_nnz,), hub_row, device="cuda")])
        col = torch.cat([col, torch.randperm(k, device="cuda", generator=gen)[:hub_nnz]])
    values = torch.randn(row.numel(), device="cuda", generator=gen)
    return row, col, values


def reference(row, col, values, x, m):
    """float64 Y = A @ x from COO (duplicates add, as in the canonical CSR)."""
    y = torch.zeros(m, x.shape[1], dtype=torch.float64, device="cuda")
    y.index_add_(0, row, values.double()[:, None] * x.double()[col])
    return y


def poison(numel):
    """Leave a NaN-filled block in the caching allocator, reused by the next allocation of that size."""
    block = torch.full((numel,), float("nan"), device="cuda")
    del block


def relative_error(out, ref):
    assert out.shape == ref.shape
    assert bool(torch.isfinite(out).all()), "output has NaN/inf: an entry was not written"
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def fp32_tolerance(csr, x, ref):
    """Bound on the relative error of a float32 product of ``csr`` and ``x`` (exact: ``ref``):
    4 x torch's own (torch.sparse.mm, cuSPARSE) on the same data, which sums in fp32 too."""
    matrix = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values, (csr.num_rows, csr.num_cols))
    torch_error = relative_error(torch.sparse.mm(matrix, x.contiguous()), ref) if ref.norm() > 0 else 0.0
    return 4 * max(torch_error, 2.0**-24) + 1e-7


def rows_of_lengths(m, k, lengths, hub_share=None):
    """COO of an m x k matrix whose row lengths are drawn from ``lengths`` (uniformly; the last
    length with probability ``hub_share`` instead, where given), random columns and values."""
    choice = torch.randint(0, len(lengths), (m,), device="cuda")
    if hub_share is not None:
        choice = torch.where(torch.rand(m, device="cuda") < hub_share, len(lengths) - 1,
                             torch.randint(0, len(lengths) - 1, (m,), device="cuda"))
    length = torch.tensor(lengths, device="cuda")[choice]
    row = torch.repeat_interleave(torch.arange(m, device="cuda"), length)
    col = torch.randint(0, k, (row.numel(),), device="cuda")
    return row, col, torch.randn(row.numel(), device="cuda")


def torch_dense_error(csr, x, ref):
    """Relative error of torch's dense matmul in x's dtype on (up to) the first 256 rows."""
    rows = min(csr.num_rows, 256)
    row = csr.row_indices()
    keep = row < rows
    dense = torch.zeros(max(rows, 64), csr.num_cols, dtype=torch.float64, device="cuda")
    dense.index_put_((row[keep].long(), csr.col[keep].long()), csr.values[keep].double(), accumulate=True)
    got = (dense.to(x.dtype) @ x)[:rows].double()
    exact = ref[:rows]
    return float((got - exact).norm() / exact.norm().clamp_min(1e-30))


def rounding_error(ref, dtype):
    return float((ref.to(dtype).double() - ref).norm() / ref.norm().clamp_min(1e-30))


def half_tolerance(csr, x, product, ref):
    """Bound on the relative error of a 16-bit product with fp32 sums: a multiple of the larger of
    torch's dense matmul error in x's dtype on ``product`` (the exact A @ x) and one rounding of
    ``ref`` (the exact output); under compute-sanitizer the rounding bound alone (cuBLAS's
    half-precision split-K GEMMs report hazards of their own under racecheck)."""
    torch_error = 0.0 if SUBSET else torch_dense_error(csr, x, product)
    return 4 * max(torch_error, rounding_error(ref, x.dtype)) + 1e-6


def product_tolerance(csr, x, product, ref):
    """For the exact product ``product`` of ``csr`` and x and the expected output ``ref``
    (product + bias): torch's own bound in x's dtype (``fp32_tolerance``, ``half_tolerance``)."""
    return fp32_tolerance(csr, x, product) if x.dtype == torch.float32 else half_tolerance(csr, x, product, ref)


def torch_tf32_error(row, col, values, x, m):
    """Relative error of torch's TF32 dense matmul on (a sample of) the same rows and x. The
    product is padded to at least 64 x 64 (zero rows, repeated columns), since cuBLAS takes a
    non-Tensor-Core path for very thin shapes and would report fp32 error instead."""
    rows = min(m, 256)
    keep = row < rows
    dense = torch.zeros(max(rows, 64), x.shape[0], device="cuda")
    dense.index_put_((row[keep], col[keep]), values[keep], accumulate=True)
    x = x.repeat(1, -(-64 // x.shape[1]))
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        got = dense @ x
    finally:
        torch.set_float32_matmul_precision(previous)
    ref = dense.double() @ x.double()
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def tf32_round(t):
    """Round float32 to TF32 (10 mantissa bits, nearest, ties away), as cvt.rna.tf32.f32 does."""
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_model_error(row, col, values, x, m, ref):
    """Relative error of exact products of TF32-rounded operands: the error TF32 must allow, also
    where cuBLAS picks a non-Tensor-Core kernel for a thin shape and reports fp32 error."""
    return float((reference(row, col, tf32_round(values), tf32_round(x), m) - ref).norm() / ref.norm().clamp_min(1e-30))


def tf32_tolerance(row, col, values, x, m, ref):
    return 4 * max(torch_tf32_error(row, col, values, x, m), tf32_model_error(row, col, values, x, m, ref)) + 1e-6


def tensor_core_spmm(x, block_values, layout, kernel):
    """A @ x through the Tensor-Core engine ``kernel`` ("base" or "balanced") on an ME-TCF layout
    and its block-order values (``build_metcf``'s), as the ``tcsparse::spmm`` op runs it: the
    kernels read CSR-order values in x's dtype, which ``csr_gather`` gives back."""
    values = block_values[layout.csr_gather.long()].to(x.dtype)
    return kernels.metcf_spmm(x, values, kernels.layout_arguments(layout), kernel == "balanced")
