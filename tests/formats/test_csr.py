"""Canonical CSR (sorted, duplicates summed, int32 where it fits) and the validation of raw arrays."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats import packed
from torch_tcsparse.formats.arrays import sort_with_positions
from torch_tcsparse.testing import coo_to_dense, index_dtypes, random_coo, tensor


def dense_of(csr):
    row = csr.row_indices()
    dense = torch.zeros(csr.num_rows, csr.num_cols, dtype=torch.float64)
    return dense.index_put_((row, csr.col.long()), csr.values.double(), accumulate=True)


def assert_canonical(csr):
    assert csr.rowptr.numel() == csr.num_rows + 1
    assert int(csr.rowptr[0]) == 0 and int(csr.rowptr[-1]) == csr.nnz
    assert bool((csr.rowptr[1:] >= csr.rowptr[:-1]).all())
    key = csr.row_indices() * max(csr.num_cols, 1) + csr.col.long()
    assert bool((key[1:] > key[:-1]).all()), "not strictly ascending: unsorted or duplicated"


@given(
    num_rows=st.integers(1, 30),
    num_cols=st.integers(1, 30),
    density=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_from_coo_is_canonical_and_sums_duplicates(num_rows, num_cols, density, seed):
    row, col, values = random_coo(num_rows, num_cols, density, seed, torch.float64, duplicates=True)
    csr = csr_mod.from_coo(row, col, values, num_rows, num_cols)
    assert_canonical(csr)
    assert torch.equal(dense_of(csr), coo_to_dense(row, col, values, (num_rows, num_cols)))
    assert csr.values.dtype == torch.float64


def test_duplicates_are_summed_not_dropped():
    csr = csr_mod.from_coo(tensor([1, 0, 1, 1]), tensor([2, 0, 2, 0]), tensor([1.0, 2.0, 3.0, 4.0]), 2, 3)
    assert csr.rowptr.tolist() == [0, 1, 3]
    assert csr.col.tolist() == [0, 0, 2]
    assert csr.values.tolist() == [2.0, 4.0, 4.0]


def test_duplicates_summed_also_without_values():
    csr = csr_mod.from_coo(tensor([0, 0, 0]), tensor([1, 1, 1]), None, 1, 2)
    assert csr.col.tolist() == [1] and csr.values.tolist() == [3.0]


@pytest.mark.parametrize("index_dtype", index_dtypes)
def test_indices_are_int32_when_they_fit(index_dtype):
    csr = csr_mod.from_coo(tensor([0, 2], dtype=index_dtype), tensor([1, 0], dtype=index_dtype), None, 3, 2)
    assert csr.rowptr.dtype == torch.int32 and csr.col.dtype == torch.int32


def test_index_dtype_is_int64_past_int32():
    assert csr_mod.index_dtype_for(2**31, 3, 5) == torch.int64
    assert csr_mod.index_dtype_for(3, 2**31, 5) == torch.int64
    assert csr_mod.index_dtype_for(3, 3, 2**31) == torch.int64
    assert csr_mod.index_dtype_for(2**31 - 1, 2**31 - 1, 2**31 - 1) == torch.int32


def test_huge_column_count_keeps_values_exact():
    # Columns past int32 force int64 indices; the row * num_cols + col sort key must not overflow.
    num_cols = 2**40
    csr = csr_mod.from_coo(tensor([1, 0, 1]), tensor([num_cols - 1, 5, 0]), tensor([1.0, 2.0, 3.0]), 2, num_cols)
    assert csr.col.dtype == torch.int64
    assert csr.rowptr.tolist() == [0, 1, 3]
    assert csr.col.tolist() == [5, 0, num_cols - 1]
    assert csr.values.tolist() == [2.0, 3.0, 1.0]


def test_from_csr_arrays_sorts_columns_and_sums_duplicates():
    rowptr, col = tensor([0, 3, 3, 5]), tensor([2, 0, 2, 1, 1])
    csr = csr_mod.from_csr_arrays(rowptr, col, tensor([1.0, 2.0, 3.0, 4.0, 5.0]), None, 3)
    assert csr.rowptr.tolist() == [0, 2, 2, 3]
    assert csr.col.tolist() == [0, 2, 1]
    assert csr.values.tolist() == [2.0, 4.0, 9.0]


def test_empty_matrices():
    for rows, cols in [(0, 0), (0, 4), (4, 0), (3, 3)]:
        csr = csr_mod.from_coo(tensor([], dtype=torch.long), tensor([], dtype=torch.long), None, rows, cols)
        assert csr.nnz == 0 and csr.rowptr.tolist() == [0] * (rows + 1)
        assert csr.values.dtype == torch.float32


def test_transpose_matches_dense_transpose_and_order():
    row, col, values = random_coo(9, 5, 0.4, seed=3, dtype=torch.float64)
    csr = csr_mod.from_coo(row, col, values, 9, 5)
    t, order = csr_mod.transpose(csr)
    assert_canonical(t)
    assert (t.num_rows, t.num_cols) == (5, 9)
    assert torch.equal(dense_of(t), dense_of(csr).t())
    assert torch.equal(t.values, csr.values[order])


# Validation: each error names the offending value.

COO_ERRORS = [
    ("negative row", dict(row=[0, -3]), ValueError, r"row.*negative.*-3"),
    ("negative col", dict(col=[0, -1]), ValueError, r"col.*negative.*-1"),
    ("row out of range", dict(row=[0, 7]), ValueError, r"row.*7.*size 3"),
    ("col out of range", dict(col=[0, 4]), ValueError, r"col.*4.*size 4"),
    ("float row", dict(row=[0.0, 1.0]), TypeError, r"row.*integers.*float32"),
    ("bool col", dict(col=[True, False]), TypeError, r"col.*integers.*bool"),
    ("mismatched lengths", dict(col=[0, 1, 2]), ValueError, r"equal length.*\(2,\).*\(3,\)"),
    ("2-D row", dict(row=[[0, 1]]), ValueError, r"1-D.*\(1, 2\)"),
    ("values length", dict(values=[1.0, 2.0, 3.0]), ValueError, r"one entry per nonzero \(2\).*\(3,\)"),
    ("integer values", dict(values=[1, 2]), TypeError, r"values.*int64"),
    ("negative num_rows", dict(num_rows=-1), ValueError, r"num_rows.*-1"),
    ("float num_cols", dict(num_cols=4.0), TypeError, r"num_cols.*float"),
]


@pytest.mark.parametrize("case", COO_ERRORS, ids=[c[0] for c in COO_ERRORS])
def test_from_coo_rejects(case):
    _, override, error, message = case
    args = dict(row=[0, 1], col=[1, 2], values=None, num_rows=3, num_cols=4) | override
    with pytest.raises(error, match=message):
        csr_mod.from_coo(tensor(args["row"]), tensor(args["col"]), tensor(args["values"]), args["num_rows"], args["num_cols"])


def test_from_coo_rejects_device_mismatch():
    # Meta indices are refused for themselves: they hold no indices to read.
    with pytest.raises(ValueError, match=r"col is a meta tensor"):
        csr_mod.from_coo(tensor([0]), tensor([0], device="meta"), None, 2, 2)
    with pytest.raises(ValueError, match=r"values is on meta but the indices are on cpu"):
        csr_mod.from_coo(tensor([0]), tensor([0]), torch.ones(1, device="meta"), 2, 2)


CSR_ERRORS = [
    ("decreasing rowptr", dict(rowptr=[0, 2, 1, 3]), ValueError, r"non-decreasing.*row 1"),
    ("rowptr not at 0", dict(rowptr=[1, 2, 3, 3]), ValueError, r"start at 0.*1"),
    ("rowptr end", dict(rowptr=[0, 1, 2, 2]), ValueError, r"ends at 2.*3 entries"),
    ("rowptr length", dict(num_rows=4), ValueError, r"4 entries.*num_rows \+ 1 = 5"),
    ("float rowptr", dict(rowptr=[0.0, 1.0, 2.0, 3.0]), TypeError, r"rowptr.*integers.*float32"),
    ("float col", dict(col=[0.0, 1.0, 2.0]), TypeError, r"col.*integers.*float32"),
    ("col out of range", dict(col=[0, 1, 9]), ValueError, r"col.*9.*size 3"),
    ("negative col", dict(col=[0, -2, 1]), ValueError, r"col.*negative.*-2"),
    ("2-D col", dict(col=[[0, 1, 2]]), ValueError, r"col must be 1-D.*\(1, 3\)"),
    ("empty rowptr", dict(rowptr=[], num_rows=None), ValueError, r"rowptr.*\(0,\)"),
    ("values length", dict(values=[1.0]), ValueError, r"one entry per nonzero \(3\).*\(1,\)"),
]


@pytest.mark.parametrize("case", CSR_ERRORS, ids=[c[0] for c in CSR_ERRORS])
def test_from_csr_arrays_rejects(case):
    _, override, error, message = case
    args = dict(rowptr=[0, 1, 2, 3], col=[0, 1, 2], values=None, num_rows=3, num_cols=3) | override
    rowptr = tensor(args["rowptr"], dtype=torch.long if args["rowptr"] == [] else None)
    with pytest.raises(error, match=message):
        csr_mod.from_csr_arrays(rowptr, tensor(args["col"]), tensor(args["values"]), args["num_rows"], args["num_cols"])


def test_from_csr_arrays_rejects_device_mismatch():
    with pytest.raises(ValueError, match=r"col is a meta tensor"):
        csr_mod.from_csr_arrays(tensor([0, 1, 1]), tensor([0], device="meta"), None, 2, 2)


@pytest.mark.parametrize("index_dtype", [torch.uint8, torch.int16, torch.int32])
def test_decreasing_rowptr_is_rejected_for_every_integer_dtype(index_dtype):
    # Differences of an unsigned rowptr wrap around instead of going negative.
    rowptr = tensor([0, 2, 1, 3], dtype=index_dtype)
    with pytest.raises(ValueError, match=r"non-decreasing.*row 1"):
        csr_mod.from_csr_arrays(rowptr, tensor([0, 1, 2], dtype=index_dtype), None, 3, 3)


@given(
    num_rows=st.integers(1, 25),
    num_cols=st.integers(1, 25),
    density=st.sampled_from([0.0, 0.2, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_from_csr_arrays_with_unsorted_duplicated_rows(num_rows, num_cols, density, seed):
    # Rows grouped (valid CSR) but columns in random order and repeated inside a row.
    row, col, values = random_coo(num_rows, num_cols, density, seed, torch.float64, duplicates=True)
    order = torch.sort(row, stable=True).indices
    rowptr = torch.zeros(num_rows + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(row, minlength=num_rows), 0)
    csr = csr_mod.from_csr_arrays(rowptr, col[order], values[order], num_rows, num_cols)
    assert_canonical(csr)
    assert torch.equal(dense_of(csr), coo_to_dense(row, col, values, (num_rows, num_cols)))


# The sorting primitives of the conversion: numpy's in-place sort of packed keys on the CPU,
# torch's stable sort where key and position do not fit 63 bits together.


@pytest.mark.parametrize("key_bound", [50, 2**40, 2**62])
def test_sort_with_positions_is_a_stable_sort(key_bound):
    generator = torch.Generator().manual_seed(7)
    key = torch.randint(0, 50, (1000,), generator=generator) * (key_bound // 50)
    expected_key, expected_order = torch.sort(key, stable=True)
    got_key, got_order = sort_with_positions(key.clone(), key_bound)
    assert torch.equal(got_key, expected_key)
    assert got_order.dtype == torch.int32 and torch.equal(got_order.long(), expected_order)
    distinct_bound = max(key_bound, 1000)
    distinct = torch.randperm(1000, generator=generator) * (distinct_bound // 1000)
    payload = torch.randperm(1000, generator=generator).int()
    _, got_payload = sort_with_positions(distinct.clone(), distinct_bound, payload)
    assert torch.equal(got_payload, payload[torch.argsort(distinct)])


@pytest.mark.parametrize("bound", [1, 50, 2**40, 2**62])
def test_stable_order_is_a_stable_sort(bound):
    generator = torch.Generator().manual_seed(8)
    values = torch.randint(0, 50, (1000,), generator=generator) * (bound // 50)
    expected = torch.sort(values, stable=True).indices
    for dtype in (torch.int32, torch.int64):
        got = packed.stable_order(values.to(dtype) if bound <= 2**31 else values, bound, dtype)
        assert got.dtype == dtype and torch.equal(got.long(), expected)


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("with_values", [False, True])
def test_from_coo_without_power_of_two_width_is_the_same(monkeypatch, duplicates, with_values):
    """Where row and column bits would not fit 63 (shapes near 2**63 elements), keys are
    row * num_cols + col split by division: same CSR."""
    row, col, values = random_coo(60, 45, 0.2, seed=12, dtype=torch.float32, duplicates=duplicates)
    values = values if with_values else None
    expected = csr_mod.from_coo(row, col, values, 60, 45)
    monkeypatch.setattr(packed, "KEY_BITS", 0)
    got = csr_mod.from_coo(row, col, values, 60, 45)
    for name in ("rowptr", "col", "values"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_row_indices_with_empty_rows_everywhere():
    csr = csr_mod.from_coo(tensor([1, 1, 4, 4, 4]), tensor([0, 2, 1, 1, 3]), None, 7, 4)
    assert csr.row_indices().tolist() == [1, 1, 4, 4]
    assert csr.row_indices(torch.int32).dtype == torch.int32
    nothing = torch.zeros(0, dtype=torch.long)
    empty = csr_mod.from_coo(nothing, nothing, None, 3, 3)
    assert empty.row_indices().tolist() == []


@pytest.mark.parametrize("num_rows,num_cols", [(1, 1), (40, 3), (3, 40), (200, 200)])
def test_transpose_order_and_values_with_duplicates(num_rows, num_cols):
    row, col, values = random_coo(num_rows, num_cols, 0.3, seed=11, dtype=torch.float32, duplicates=True)
    csr = csr_mod.from_coo(row, col, values, num_rows, num_cols)
    t, order = csr_mod.transpose(csr)
    assert_canonical(t)
    assert order.dtype == csr.col.dtype
    assert torch.equal(t.values, csr.values[order])
    assert torch.equal(dense_of(t), dense_of(csr).t())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_scipy_csr_computes_in_scipy_for_every_value_dtype(dtype):
    """16-bit values come out in float32 (exact): scipy.sparse computes on neither 16-bit type."""
    csr = csr_mod.from_coo(torch.tensor([0, 1, 1]), torch.tensor([2, 0, 1]), torch.tensor([0.5, -2.0, 3.0]), 2, 3, dtype)
    matrix = csr_mod.scipy_csr(csr.rowptr, csr.col, csr.values, (2, 3))
    assert matrix.dtype == ("float64" if dtype == torch.float64 else "float32")
    assert (matrix.toarray() == dense_of(csr).numpy()).all()
