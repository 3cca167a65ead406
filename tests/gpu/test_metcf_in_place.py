"""The Tensor-Core kernels read the matrix's CSR-order values in place: at the binding, values
held at an odd element offset (16-bit values then start mid-word), windows of many balanced
chunks (a hub row, dense windows, windows cut between warps), window 8 and 16, row
permutations, the three kernels (base, balanced, deterministic balanced) and every dtype; at the
engine, operands that alias the values and a write through the storage that the next product of
a kept operand sees. Outputs land in NaN-poisoned memory; tolerances are multiples of torch's own
error at the same precision against float64 references."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_layout

from .kernel_data import KERNELS, poison, random_matrix, reference, relative_error, tf32_tolerance

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def offset_view(values: torch.Tensor) -> torch.Tensor:
    """``values`` copied into a larger tensor at element offset 1 (odd: 2-byte but not 4-byte
    aligned for 16-bit values)."""
    storage = torch.full((values.numel() + 2,), float("nan"), dtype=values.dtype, device=values.device)
    view = storage[1 : values.numel() + 1]
    view.copy_(values)
    return view


def tolerance(csr, values, x, m, ref, dtype) -> float:
    """float32: the TF32 tolerance of the other Tensor-Core tests (the kernels multiply in TF32 or
    3xTF32); 16 bits: 4x the larger of torch's dense error for A @ x in ``dtype`` and one rounding
    of the result."""
    if dtype == torch.float32:
        return tf32_tolerance(csr.row_indices(), csr.col.long(), values, x, m, ref)
    dense = torch.zeros(m, x.shape[0], dtype=dtype, device="cuda")
    dense[csr.row_indices(), csr.col.long()] = values
    torch_error = float((dense @ x - ref).double().norm() / ref.norm().clamp_min(1e-30))
    rounding = float((ref.to(dtype).double() - ref).norm() / ref.norm().clamp_min(1e-30))
    return 4 * max(torch_error, rounding) + 1e-6


def run(kernels, layout, values, x, kernel, deterministic):
    poison(layout.num_rows * x.shape[1] * x.element_size() // 4 + 1)
    torch.use_deterministic_algorithms(deterministic)
    try:
        out = kernels.metcf_spmm(x, values, kernels.layout_arguments(layout), kernel == "balanced")
    finally:
        torch.use_deterministic_algorithms(False)
    torch.cuda.synchronize()
    return out


CASES = {
    "hub": dict(m=3000, k=3000, mean_degree=6, hub_row=17, hub_nnz=2500),
    "dense_windows": dict(m=64, k=4000, mean_degree=1500),
    "sparse": dict(m=2001, k=1500, mean_degree=3, empty_fraction=0.3),
}


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("window, row_perm", [(16, False), (16, True), (8, True)])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n", [1, 8, 33, 128, 200])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_values_at_an_odd_offset(kernels, dtype, kernel, n, case, window, row_perm, deterministic):
    if deterministic and kernel == "base":
        pytest.skip("the base kernel is deterministic already")
    matrix = CASES[case]
    m, k = matrix["m"], matrix["k"]
    rest = {key: value for key, value in matrix.items() if key not in ("m", "k", "mean_degree")}
    row, col, values = random_matrix(m, k, matrix["mean_degree"], seed=5, **rest)
    csr = from_coo(row, col, values.to(dtype), m, k)
    perm = torch.randperm(m, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6)) if row_perm else None
    layout = build_layout(csr, window, perm)
    if case == "dense_windows":
        assert int((layout.chunk_offsets[1:] - layout.chunk_offsets[:-1]).max()) > 3
    x = torch.randn(k, n, device="cuda").to(dtype)
    ref = reference(csr.row_indices(), csr.col.long(), csr.values, x, m)
    held = offset_view(csr.values)
    out = run(kernels, layout, held, x, kernel, deterministic)
    assert out.dtype == dtype
    err = relative_error(out, ref)
    assert err <= tolerance(csr, csr.values, x, m, ref, dtype), f"relative error {err:.3g}"
    # The contiguous values give the same result bit for bit (same kernel, same reads).
    if deterministic or kernel == "base":
        assert torch.equal(out, run(kernels, layout, csr.values.contiguous().clone(), x, kernel, deterministic))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_engine_operands_alias_the_values_and_see_storage_writes(kernel, dtype):
    row, col, values = random_matrix(500, 400, 8, seed=7, hub_row=3, hub_nnz=390)
    base = TCSparseTensor.from_coo(row, col, values.to(dtype), (500, 400))
    held = base.csr.values.clone()
    a = base.with_values(held)
    engine = ENGINES[kernel]
    operands = engine.operands(engine.indices(a._structure, dtype), held)
    assert operands.values.data_ptr() == held.data_ptr()
    assert engine.reads_in_place(operands, held)
    x = torch.randn(400, 64, device="cuda").to(dtype)
    a.matmul(x, path=kernel)  # the matrix keeps its operands from here
    new = (held.float() * -3 + 1).to(dtype)
    held.untyped_storage().copy_(new.untyped_storage())  # no version counter moves
    poison(500 * 64 * x.element_size() // 4 + 1)
    y = a.matmul(x, path=kernel)
    csr = a.csr
    ref = reference(csr.row_indices(), csr.col.long(), new, x, 500)
    assert relative_error(y, ref) <= tolerance(csr, new, x, 500, ref, dtype)


def test_values_of_another_dtype_than_x_are_cast_per_product(kernels):
    row, col, values = random_matrix(300, 300, 6, seed=8)
    a = TCSparseTensor.from_coo(row, col, values, (300, 300))
    engine = ENGINES["base"]
    operands = engine.operands(engine.indices(a._structure, torch.float16), a.csr.values)
    x = torch.randn(300, 32, device="cuda").half()
    y = engine.run(x, operands, None)
    csr = a.csr
    ref = reference(csr.row_indices(), csr.col.long(), csr.values.half(), x, 300)
    assert y.dtype == torch.float16
    assert relative_error(y, ref) <= tolerance(csr, csr.values.half(), x, 300, ref, torch.float16)
