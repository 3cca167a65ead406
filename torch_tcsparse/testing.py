"""Shared helpers for the test suite: dtype and device lists, random sparse matrices, and float64
references with tolerances derived from torch's own error at the precision under test
(in the manner of torch_sparse/testing.py)."""
from __future__ import annotations

import numpy as np
import torch

float_dtypes = [torch.float32, torch.float64]
half_dtypes = [torch.float16, torch.bfloat16]
value_dtypes = float_dtypes + half_dtypes
index_dtypes = [torch.int32, torch.int64]

devices = [torch.device("cpu")]
if torch.cuda.is_available():
    devices.append(torch.device("cuda"))

cpu_paths = ["reference", "csr", "auto"]


def tensor(data, dtype=None, device=None) -> torch.Tensor:
    return None if data is None else torch.tensor(data, dtype=dtype, device=device)


def random_coo(
    num_rows: int,
    num_cols: int,
    density: float,
    seed: int,
    dtype: torch.dtype = torch.float32,
    duplicates: bool = False,
    dense_row: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """COO triplets (row, col, values) of a random ``num_rows x num_cols`` matrix.

    Each entry is present with probability ``density``; ``dense_row`` fills one row completely;
    ``duplicates`` repeats a random third of the entries (so summation is exercised). Values are
    integers in [-4, 4] \\ {0} divided by 4: exact in every dtype, and never zero, so a summed
    duplicate or a product is exactly representable in float64."""
    rng = np.random.default_rng(seed)
    mask = rng.random((num_rows, num_cols)) < density
    if dense_row is not None and num_rows:
        mask[dense_row % num_rows, :] = True
    row, col = np.nonzero(mask)
    if duplicates and row.size:
        again = rng.choice(row.size, size=max(1, row.size // 3), replace=True)
        row, col = np.concatenate([row, row[again]]), np.concatenate([col, col[again]])
        order = rng.permutation(row.size)
        row, col = row[order], col[order]
    magnitude = rng.integers(1, 5, size=row.size)
    sign = rng.choice([-1, 1], size=row.size)
    values = torch.from_numpy(magnitude * sign / 4.0).to(dtype)
    return torch.from_numpy(row.astype(np.int64)), torch.from_numpy(col.astype(np.int64)), values


def coo_to_dense(row, col, values, shape, dtype=torch.float64) -> torch.Tensor:
    """Dense matrix with duplicates summed, in ``dtype`` (float64 by default: the reference)."""
    dense = torch.zeros(shape, dtype=dtype)
    return dense.index_put_((row.long(), col.long()), values.to(dtype), accumulate=True)


def random_dense(num_rows: int, num_cols: int, density: float, seed: int, dtype=torch.float32, dense_row=None):
    row, col, values = random_coo(num_rows, num_cols, density, seed, dtype, dense_row=dense_row)
    return coo_to_dense(row, col, values, (num_rows, num_cols), dtype)


def random_permutation(size: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).permutation(size).astype(np.int64))


def reference_matmul(a_dense: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A @ X in float64 on the CPU: the reference every path is compared with."""
    return a_dense.detach().double().cpu() @ x.detach().double().cpu()


def tolerance(a_dense: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, factor: float = 4.0) -> float:
    """Absolute error allowed for A @ X computed at ``dtype``: ``factor`` times the worst error of
    torch's own dense matmul at that precision, and never below a few units in the last place
    of the result's scale (torch can be exact by luck on small integer-valued inputs)."""
    exact = reference_matmul(a_dense, x)
    torch_result = (a_dense.to(x.device, dtype) @ x.to(dtype)).double().cpu()
    torch_error = float((torch_result - exact).abs().max()) if exact.numel() else 0.0
    scale = float(reference_matmul(a_dense.abs(), x.abs()).max()) if exact.numel() else 0.0
    return factor * torch_error + 4 * torch.finfo(dtype).eps * scale


def assert_matches_reference(result: torch.Tensor, a_dense: torch.Tensor, x: torch.Tensor, dtype=None) -> None:
    """``result`` (computed at ``dtype``) equals float64 ``a_dense @ x`` within ``tolerance``."""
    dtype = result.dtype if dtype is None else dtype
    exact = reference_matmul(a_dense, x)
    assert result.shape == exact.shape, f"shape {tuple(result.shape)} != {tuple(exact.shape)}"
    assert result.dtype == dtype, f"dtype {result.dtype} != {dtype}"
    error = float((result.detach().double().cpu() - exact).abs().max()) if exact.numel() else 0.0
    allowed = tolerance(a_dense, x, dtype)
    assert error <= allowed, f"max error {error:.3g} exceeds {allowed:.3g} (dtype {dtype})"
