"""The CPU conversion's compiled passes (``formats.native``: transpose, ME-TCF layout, the link of
a matrix's block order to its transpose's) against the torch route they replace, array for array;
the torch route where no compiler is found; refusal of inconsistent arrays."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, native_build
from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats import native
from torch_tcsparse.formats.metcf import build_layout, count_blocks
from torch_tcsparse.selector import build as selector_build
from torch_tcsparse.structure import Structure
from torch_tcsparse.testing import random_coo, random_permutation

if native.library() is None:
    pytest.skip("the CPU passes could not be built (no C++ compiler)", allow_module_level=True)

SHAPES = [(0, 0), (1, 1), (5, 3), (37, 70), (70, 37), (128, 128), (200, 50)]
DENSITIES = [0.0, 0.03, 0.3, 1.0]


def generic(monkeypatch):
    """Sends every caller of the compiled passes down the torch route."""
    monkeypatch.setattr(native, "library", lambda: None)


def random_csr(num_rows, num_cols, density, seed, symmetric=False, empty_lines=False, index_dtype=None):
    row, col, values = random_coo(num_rows, num_cols, density, seed, torch.float64)
    if symmetric:
        row, col, values = torch.cat([row, col]), torch.cat([col, row]), torch.cat([values, values])
    if empty_lines and row.numel():
        keep = (row % 3 != 1) & (col % 4 != 2)
        row, col, values = row[keep], col[keep], values[keep]
    csr = csr_mod.from_coo(row, col, values, num_rows, num_cols)
    if index_dtype is None:
        return csr
    return csr_mod.CSR(csr.rowptr.to(index_dtype), csr.col.to(index_dtype), csr.values, num_rows, num_cols)


def assert_same_layout(actual, expected):
    for name in expected.TENSOR_FIELDS:
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), name
    if expected.host_counts is not None:
        for name in ("window_offsets", "chunk_offsets", "nonempty_before"):
            assert (getattr(actual.host_counts, name) == getattr(expected.host_counts, name)).all(), name
        assert actual.host_counts.max_row_nnz == expected.host_counts.max_row_nnz


CASES = [
    pytest.param(num_rows, num_cols, density, seed, id=f"{num_rows}x{num_cols}-{density}")
    for seed, ((num_rows, num_cols), density) in enumerate((shape, d) for shape in SHAPES for d in DENSITIES)
]


@pytest.mark.parametrize("num_rows, num_cols, density, seed", CASES)
@pytest.mark.parametrize("window", [8, 16])
@pytest.mark.parametrize("with_perm", [False, True])
@pytest.mark.parametrize("empty_lines", [False, True])
def test_layout_is_the_torch_layout(num_rows, num_cols, density, seed, window, with_perm, empty_lines):
    csr = random_csr(num_rows, num_cols, density, seed, empty_lines=empty_lines)
    perm = random_permutation(num_rows, seed) if with_perm else None
    expected = build_layout(csr, window, perm, use_kernels=False)
    assert_same_layout(build_layout(csr, window, perm), expected)
    assert torch.equal(count_blocks(csr, window, perm), count_blocks(csr, window, perm, use_kernels=False))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("symmetric", [False, True])
def test_transpose_is_the_torch_transpose(monkeypatch, index_dtype, symmetric):
    for seed, (num_rows, num_cols) in enumerate(SHAPES):
        square = min(num_rows, num_cols) if symmetric else None
        shape = (square, square) if symmetric else (num_rows, num_cols)
        csr = random_csr(*shape, 0.2, seed, symmetric=symmetric, index_dtype=index_dtype)
        fast = csr_mod.transpose_pattern(csr)
        with monkeypatch.context() as patch:
            generic(patch)
            expected = csr_mod.transpose_pattern(csr)
        for a, e in zip(fast, expected):
            assert a.dtype == e.dtype and torch.equal(a, e)


def test_layout_of_int64_indices_is_the_torch_layout():
    csr = random_csr(90, 60, 0.2, 3, index_dtype=torch.int64)
    for window, perm in [(16, None), (8, random_permutation(90, 4))]:
        assert_same_layout(build_layout(csr, window, perm), build_layout(csr, window, perm, use_kernels=False))


def structures(monkeypatch, csr, window, row_perm, col_perm, route):
    """A structure of ``csr`` and its transpose, built by the compiled passes or the torch route."""
    with monkeypatch.context() as patch:
        if route == "torch":
            generic(patch)
        structure = Structure(csr, window, row_perm, col_perm, "given")
        return structure, structure.transposed()


@pytest.mark.parametrize("window", [8, 16])
@pytest.mark.parametrize("perms", ["none", "rows", "both"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("nonzeros", ["none", "some"])
def test_transposed_structure_is_the_torch_one(monkeypatch, window, perms, symmetric, nonzeros):
    num_rows, num_cols = (60, 60) if symmetric else (60, 45)
    csr = random_csr(num_rows, num_cols, 0.0 if nonzeros == "none" else 0.15, window, symmetric=symmetric,
                     empty_lines=True)
    row_perm = None if perms == "none" else random_permutation(num_rows, 1)
    col_perm = None
    if perms == "both":
        col_perm = row_perm if symmetric else random_permutation(num_cols, 2)
    built = {route: structures(monkeypatch, csr, window, row_perm, col_perm, route) for route in ("fast", "torch")}
    for fast, expected in zip(built["fast"], built["torch"]):
        assert_same_layout(fast.layout, expected.layout)
        assert torch.equal(fast.rowptr, expected.rowptr) and torch.equal(fast.col, expected.col)
    fast, fast_t = built["fast"]
    assert (fast_t.layout.block_cols is fast.layout.block_cols) == (built["torch"][1].layout.block_cols is
                                                                     built["torch"][0].layout.block_cols)


@pytest.mark.parametrize("reorder", ["none", "perm"])
def test_tensor_transpose_is_the_torch_one(monkeypatch, reorder):
    row, col, values = random_coo(150, 150, 0.05, seed=11, dtype=torch.float32, duplicates=True)
    options = {} if reorder == "none" else {"reorder": random_permutation(150, 12)}
    a = TCSparseTensor.from_coo(row, col, values, (150, 150), **options)
    with monkeypatch.context() as patch:
        generic(patch)
        expected = TCSparseTensor.from_coo(row, col, values, (150, 150), **options).t()
    t = a.t()
    assert torch.equal(t.to_dense(), a.to_dense().t())
    assert torch.equal(t.to_dense(), expected.to_dense())
    assert_same_layout(t._structure.layout, expected._structure.layout)


def test_without_a_compiler_the_torch_route_builds_the_same(monkeypatch, tmp_path):
    csr = random_csr(80, 50, 0.2, 5)
    expected = Structure(csr, 16, None, None, "none").transposed()
    monkeypatch.setenv("TCSPARSE_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_tried", False)
    assert native.library() is None
    t = Structure(csr, 16, None, None, "none").transposed()
    assert_same_layout(t.layout, expected.layout)
    assert torch.equal(t.rowptr, expected.rowptr) and torch.equal(t.col, expected.col)


def test_inconsistent_arrays_are_refused():
    lib = native.library()
    csr = random_csr(20, 20, 0.3, 6)
    bad_col = csr.col.clone()
    bad_col[3] = 25
    with pytest.raises(ValueError, match="tcs_csr_transpose: a column index out of range"):
        native.csr_transpose(lib, csr.rowptr, bad_col, 20, 20, torch.int32)
    bad_rowptr = csr.rowptr.clone()
    bad_rowptr[5] = bad_rowptr[6] + 1
    with pytest.raises(ValueError, match="a row pointer out of order or range"):
        native.csr_transpose(lib, bad_rowptr, csr.col, 20, 20, torch.int32)
    with pytest.raises(ValueError, match="rowptr must hold num_rows \\+ 1 = 22 entries"):
        native.csr_transpose(lib, csr.rowptr, csr.col, 21, 20, torch.int32)
    # A row listed in two windows would place more nonzeros than there are.
    longest = int((csr.rowptr[1:] - csr.rowptr[:-1]).argmax())
    row_map = torch.full((32,), longest, dtype=torch.int32)
    with pytest.raises(ValueError, match="a row \\(row_map, rowptr\\) out of range"):
        blocks = native.metcf_blocks(lib, csr.rowptr, csr.col, row_map, 20, 20, 16)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), blocks.cumsum(0)]).to(torch.int32)
        native.metcf_fill(lib, csr.rowptr, csr.col, row_map, 20, 20, 16, offsets, int(offsets[-1]), torch.int32)
    row_map[0] = 20
    with pytest.raises(ValueError, match="a row \\(row_map, rowptr\\) out of range"):
        native.metcf_blocks(lib, csr.rowptr, csr.col, row_map, 20, 20, 16)
    row_map = torch.arange(32, dtype=torch.int32).masked_fill_(torch.arange(32) >= 20, -1)
    offsets = torch.tensor([0, 1, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="window offsets that disagree with the matrix"):
        native.metcf_fill(lib, csr.rowptr, csr.col, row_map, 20, 20, 16, offsets, 1, torch.int32)
    ours = torch.arange(10, dtype=torch.int32)
    with pytest.raises(ValueError, match="an index out of range of the nonzeros"):
        native.link_gathers(lib, ours, ours.flip(0).clone().fill_(10), True)


def test_the_libraries_share_one_builder(monkeypatch, tmp_path):
    monkeypatch.setenv("TCSPARSE_BUILD_DIR", str(tmp_path))
    paths = native_build.library_path(native.CPU_PASSES), selector_build.library_path()
    assert paths[0].parent.parent == paths[1].parent.parent == tmp_path
    assert paths[0].name == native.CPU_PASSES.name and paths[0] != paths[1]
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(RuntimeError, match="the CPU conversion's native code is C\\+\\+ and needs a C\\+\\+ compiler"):
        native_build.build(native.CPU_PASSES)


@pytest.mark.parametrize("threads", [1, 3])
def test_passes_split_over_threads_build_the_same(monkeypatch, threads):
    """Above a few ten thousand nonzeros the passes split their work over torch's thread count,
    by nonzeros (a hub row's window is one range): the same arrays as the torch route."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        num_rows, num_cols = 3000, 2000
        row = torch.randint(0, num_rows, (120_000,), generator=torch.Generator().manual_seed(threads))
        col = torch.randint(0, num_cols, (120_000,), generator=torch.Generator().manual_seed(threads + 1))
        row[:5000] = 17
        csr = csr_mod.from_coo(row, col, None, num_rows, num_cols)
        perm = random_permutation(num_rows, 3)
        built = {route: structures(monkeypatch, csr, 16, perm, None, route) for route in ("fast", "torch")}
    finally:
        torch.set_num_threads(previous)
    for fast, expected in zip(built["fast"], built["torch"]):
        assert_same_layout(fast.layout, expected.layout)
        assert torch.equal(fast.rowptr, expected.rowptr) and torch.equal(fast.col, expected.col)


@pytest.mark.parametrize("route", ["fast", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_first_and_later_transposes_gather_the_same_values(monkeypatch, route, dtype):
    """The transpose that builds the structure gathers its values with the build's order, later
    ones through the block orders: bit for bit the same values, signed zeros included, and the
    same gradient."""
    if route == "torch":
        generic(monkeypatch)
    row, col, _ = random_coo(90, 70, 0.1, seed=13, dtype=dtype)
    values = torch.randn(row.numel(), dtype=dtype)
    values[::7] = -0.0
    a = TCSparseTensor.from_coo(row, col, values, (90, 70))
    leaf = a._values.detach().clone().requires_grad_(True)
    built = a.with_values(leaf).t()
    later = a.with_values(leaf).t()
    assert torch.equal(built._values, later._values)
    assert torch.equal(torch.signbit(built._values), torch.signbit(later._values))
    assert torch.equal(built.to_dense(), a.to_dense().t())
    weights = torch.randn(built._values.shape, dtype=dtype)
    (grad_built,) = torch.autograd.grad((built._values * weights).sum(), leaf)
    (grad_later,) = torch.autograd.grad((later._values * weights).sum(), leaf)
    assert torch.equal(grad_built, grad_later)


def coo_routes(monkeypatch, row, col, values, num_rows, num_cols, dtype=None):
    """The canonical CSR of COO entries by the compiled sort and by the torch route."""
    fast = csr_mod.from_coo(row, col, values, num_rows, num_cols, dtype)
    with monkeypatch.context() as patch:
        generic(patch)
        expected = csr_mod.from_coo(row, col, values, num_rows, num_cols, dtype)
    return fast, expected


def assert_same_csr(actual, expected):
    for name in ("rowptr", "col", "values"):
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), name
    assert torch.equal(torch.signbit(actual.values), torch.signbit(expected.values))


@pytest.mark.parametrize("num_rows, num_cols", SHAPES)
@pytest.mark.parametrize("values_dtype", [None, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.uint8, torch.int32, torch.int64])
def test_coo_sort_is_the_torch_conversion(monkeypatch, num_rows, num_cols, values_dtype, index_dtype):
    """Entries in any order with repeats (summed from the first, signed zeros kept): the compiled
    counting sort builds the torch route's CSR array for array."""
    generator = torch.Generator().manual_seed(num_rows * 1000 + num_cols)
    count = 3 * num_rows * num_cols // 2 if num_rows * num_cols < 200 else 4000
    row = torch.randint(0, max(num_rows, 1), (count if num_rows and num_cols else 0,), generator=generator)
    col = torch.randint(0, max(num_cols, 1), (row.numel(),), generator=generator)
    row, col = row.to(index_dtype), col.to(index_dtype)
    values = None
    if values_dtype is not None:
        values = torch.randint(-4, 5, (row.numel(),), generator=generator).to(values_dtype) / 4
        values[::5] = -0.0
    assert_same_csr(*coo_routes(monkeypatch, row, col, values, num_rows, num_cols))


def test_coo_sort_of_sorted_rows_and_hub_rows_split_over_threads(monkeypatch):
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        generator = torch.Generator().manual_seed(5)
        row = torch.randint(0, 3000, (200_000,), generator=generator)
        col = torch.randint(0, 50_000, (200_000,), generator=generator)
        row[:60_000] = 17
        values = torch.randn(200_000, generator=generator, dtype=torch.float64)
        assert_same_csr(*coo_routes(monkeypatch, row, col, values, 3000, 50_000, torch.float32))
        order = torch.argsort(row * 50_000 + col)
        assert_same_csr(*coo_routes(monkeypatch, row[order], col[order], values[order], 3000, 50_000))
    finally:
        torch.set_num_threads(previous)


def test_coo_sort_refuses_indices_out_of_range():
    lib = native.library()
    with pytest.raises(ValueError, match="tcs_coo_sort: a row index out of range"):
        native.coo_sort(lib, torch.tensor([0, 3]), torch.tensor([0, 1]), 3, 2, torch.int32, None)
    with pytest.raises(ValueError, match="tcs_coo_sort: a column index out of range"):
        native.coo_sort(lib, torch.tensor([0, 2]), torch.tensor([0, -1]), 3, 2, torch.int32, torch.int32)
