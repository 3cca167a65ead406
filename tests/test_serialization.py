"""torch.save / torch.load of a TCSparseTensor, with and without weights_only, and crafted files
that must give a ValueError on load rather than a layout that reads out of bounds later."""
import io
import struct

import pytest
import torch
from memory import PeakGrowth
from saved_files import records_of, zipped

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.serialization import load
from torch_tcsparse.testing import random_dense, random_permutation


def save_and_load(obj, weights_only):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=weights_only)


def assert_same(loaded, original):
    assert isinstance(loaded, TCSparseTensor)
    assert loaded.shape == original.shape and loaded.dtype == original.dtype
    assert torch.equal(loaded.to_dense(), original.to_dense())
    s, t = loaded._structure, original._structure
    assert (s.window, s.method) == (t.window, t.method)
    for mine, theirs in zip(s.layout.tensors(), t.layout.tensors()):
        assert torch.equal(mine, theirs)
    assert (s.row_perm is None) == (t.row_perm is None)
    assert (s.col_perm is None) == (t.col_perm is None)


OPTIONS = {
    "plain": dict(),
    "window8_float64": dict(window=8, dtype=torch.float64),
    "permuted": dict(reorder=random_permutation(21, seed=3)),
    "permuted_rows_only": dict(reorder=random_permutation(21, seed=4), symmetric=False),
    "bfloat16": dict(dtype=torch.bfloat16),
    "rcm": dict(reorder="rcm"),
}


@pytest.mark.parametrize("weights_only", [False, True])
@pytest.mark.parametrize("options", list(OPTIONS))
def test_round_trip(options, weights_only):
    original = TCSparseTensor.from_dense(random_dense(21, 21, 0.2, seed=1), **OPTIONS[options])
    loaded = save_and_load(original, weights_only)
    assert_same(loaded, original)
    x = torch.randn(21, 3).to(original.dtype)
    torch.testing.assert_close(loaded.matmul(x, path="reference"), original.matmul(x, path="reference"))


@pytest.mark.parametrize("weights_only", [False, True])
def test_round_trip_inside_a_state_dict_and_of_an_empty_matrix(weights_only):
    a = TCSparseTensor.from_dense(random_dense(9, 4, 0.3, seed=2))
    empty = TCSparseTensor.from_dense(torch.zeros(3, 0))
    loaded = save_and_load({"adjacency": a, "empty": empty, "weight": torch.ones(2)}, weights_only)
    assert_same(loaded["adjacency"], a)
    assert_same(loaded["empty"], empty)


def test_round_trip_detaches_values_that_require_grad():
    a = TCSparseTensor.from_dense(random_dense(6, 6, 0.4, seed=5))
    values = a.csr.values.clone().requires_grad_()
    loaded = save_and_load(a.with_values(values), weights_only=True)
    assert not loaded.csr.values.requires_grad
    assert torch.equal(loaded.csr.values, values.detach())


class Crafted:
    """Pickles as a TCSparseTensor whose saved state was edited."""

    def __init__(self, state):
        self.state = state

    def __reduce_ex__(self, protocol):
        rebuild, _ = VALID.__reduce_ex__(protocol)
        return rebuild, (self.state,)


VALID = TCSparseTensor.from_dense(
    torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [4.0, 0.0, 0.0]]), reorder=torch.tensor([2, 0, 1])
)


def saved_state():
    _, (state,) = VALID.__reduce_ex__(2)
    return dict(state)


CRAFTED = {
    "col out of range": (dict(col=torch.tensor([0, 2, 1, 9], dtype=torch.int32)), r"col.*9.*size 3"),
    "negative col": (dict(col=torch.tensor([0, -2, 1, 0], dtype=torch.int32)), r"negative.*-2"),
    "decreasing rowptr": (dict(rowptr=torch.tensor([0, 3, 2, 4], dtype=torch.int32)), r"non-decreasing"),
    "rowptr past col": (dict(rowptr=torch.tensor([0, 2, 3, 9], dtype=torch.int32)), r"ends at 9"),
    "float rowptr": (dict(rowptr=torch.tensor([0.0, 2.0, 3.0, 4.0])), r"rowptr.*int32 or int64.*float32"),
    "byte rowptr": (dict(rowptr=torch.tensor([0, 2, 3, 4], dtype=torch.uint8)), r"rowptr.*int32 or int64.*uint8"),
    "int16 col": (dict(col=torch.tensor([0, 2, 1, 0], dtype=torch.int16)), r"col.*int32 or int64.*int16"),
    "wrong version": (dict(version=99), r"version"),
    "repeated row_perm": (dict(row_perm=torch.tensor([0, 0, 1])), r"permutation"),
    "row_perm out of range": (dict(row_perm=torch.tensor([0, 1, 3])), r"outside \[0, 3\)"),
    "short row_perm": (dict(row_perm=torch.tensor([0, 1])), r"3 entries"),
    "row_perm as a method name": (dict(row_perm="auto"), r"row_perm|permutation|reorder"),
    "short values": (dict(values=torch.ones(3)), r"\(4\).*\(3,\)"),
    "values as a list": (dict(values=[1.0, 2.0, 3.0, 4.0]), r"values"),
    "integer values": (dict(values=torch.ones(4, dtype=torch.int64)), r"int64"),
    "unsorted columns": (dict(col=torch.tensor([2, 0, 1, 0], dtype=torch.int32)), r"canonical"),
    "shape smaller than rowptr": (dict(shape=(2, 3)), r"num_rows \+ 1"),
    "negative shape": (dict(shape=(3, -1)), r"-1"),
    "bad window": (dict(window=5), r"window.*5"),
    "missing col": (dict(col=None), r"col"),
    "shape of floats": (dict(shape=(3.0, 3.0)), r"num_rows must be an int"),
    "shape of three": (dict(shape=(3, 3, 1)), r"shape.*pair.*\(3, 3, 1\)"),
    "shape overflowing int64": (dict(shape=(3, 2**62)), r"too large"),
    # A transpose would hold 2**40 + 1 row offsets: 8 TB from a file of a few hundred bytes.
    "columns no array stores": (dict(shape=(3, 2**40)), r"at most num_rows \+ nnz \+ 4194304 columns, got 1099511627776"),
    "2-D values": (dict(values=torch.ones(4, 1)), r"values.*1-D.*\(4, 1\)"),
    "window as a float": (dict(window=16.0), r"window.*16\.0"),
    "symmetric as a string": (dict(symmetric="yes"), r"symmetric.*'yes'"),
    "method as a number": (dict(method=3), r"method.*3"),
}


@pytest.mark.parametrize("weights_only", [False, True])
@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_file_gives_value_error(name, weights_only):
    edit, message = CRAFTED[name]
    state = saved_state() | edit
    buffer = io.BytesIO()
    torch.save(Crafted(state), buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match=message):
        torch.load(buffer, weights_only=weights_only)


def test_a_matrix_whose_file_would_be_refused_is_not_saved():
    wide = TCSparseTensor.from_coo(torch.tensor([0, 2]), torch.tensor([1, 2**40]), shape=(3, 2**40 + 1))
    with pytest.raises(ValueError, match=r"columns, got 1099511627777"):
        torch.save(wide, io.BytesIO())


def test_crafted_state_without_a_key_gives_value_error():
    state = saved_state()
    del state["rowptr"]
    buffer = io.BytesIO()
    torch.save(Crafted(state), buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match=r"rowptr"):
        torch.load(buffer, weights_only=True)


def test_deepcopy_goes_through_the_same_rebuild():
    import copy

    original = TCSparseTensor.from_dense(random_dense(12, 7, 0.3, seed=6))
    copied = copy.deepcopy(original)
    assert_same(copied, original)
    assert copied._structure is not original._structure


def save_state(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(Crafted(state), buffer)
    return buffer.getvalue()


def expanded(value, size: int, dtype) -> torch.Tensor:
    """A tensor of ``size`` entries that stores one: what a stride of 0 makes of a saved array."""
    return torch.full((1,), value, dtype=dtype).expand(size)


def overlapping_rowptr_and_col():
    storage = torch.tensor([0, 0, 0, 1], dtype=torch.int32)
    return dict(rowptr=storage, col=storage[3:], values=torch.ones(1), row_perm=None)


HUGE = 2**26
BOMBS = {
    "expanded rowptr": dict(shape=(HUGE, 3), rowptr=expanded(0, HUGE + 1, torch.int32),
                            col=torch.zeros(0, dtype=torch.int32), values=torch.ones(0), row_perm=None),
    "expanded col and values": dict(shape=(1, 3), rowptr=torch.tensor([0, HUGE], dtype=torch.int32),
                                    col=expanded(0, HUGE, torch.int32), values=expanded(1.0, HUGE, torch.float32),
                                    row_perm=None),
    "expanded row_perm": dict(row_perm=expanded(0, 3, torch.int64)),
    "rowptr and col in one storage": overlapping_rowptr_and_col(),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_expanded_or_overlapping_arrays_are_refused_before_they_are_read(name):
    data = save_state(saved_state() | BOMBS[name])
    assert len(data) < 4096
    with PeakGrowth() as peak:
        with pytest.raises(ValueError, match=r"expanded tensor \(stride 0\)|overlap"):
            torch.load(io.BytesIO(data), weights_only=True)
    assert peak.bytes < 64 * 2**20, f"loading a {len(data)}-byte file raised the peak by {peak.bytes / 2**20:.0f} MiB"


def test_strided_values_of_a_matrix_round_trip():
    strided = VALID.csr.values.repeat_interleave(2)[::2]
    loaded = save_and_load(VALID.with_values(strided), weights_only=True)
    assert torch.equal(loaded.to_dense(), VALID.to_dense())


def truncated_record(data: bytes) -> bytes:
    records = records_of(data)
    name = next(name for name in records if "/data/" in name and not name.endswith(".pkl"))
    return zipped(records | {name: records[name][: len(records[name]) // 2]})


def truncated_pickle(data: bytes) -> bytes:
    records = records_of(data)
    name = next(name for name in records if name.endswith("data.pkl"))
    return zipped(records | {name: records[name][: len(records[name]) // 2]})


DAMAGED = {
    "truncated file": lambda data: data[: len(data) // 2],
    "truncated storage record": truncated_record,
    "truncated pickle": truncated_pickle,
    "not a torch file": lambda data: b"TCSparseTensor" * 10,
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_load_gives_value_error_for_a_damaged_archive(name):
    buffer = io.BytesIO()
    torch.save(VALID, buffer)
    with pytest.raises(ValueError, match=r"not a readable torch file"):
        load(io.BytesIO(DAMAGED[name](buffer.getvalue())))


def test_load_reads_what_torch_save_wrote():
    buffer = io.BytesIO()
    torch.save({"adjacency": VALID}, buffer)
    buffer.seek(0)
    assert_same(load(buffer)["adjacency"], VALID)


def zip64_directory_entry(name: bytes, method: int, stored: int, inflated: int) -> bytes:
    """An archive of one directory entry whose sizes overflow 32 bits: kept in a zip64 extra field."""
    extra = struct.pack("<2H2Q", 1, 16, inflated, stored)
    entry = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 45, 45, 0, method, 0, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF,
                        len(name), len(extra), 0, 0, 0, 0, 0) + name + extra
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(entry), 0, 0)
    return entry + end


def test_the_archive_check_reads_zip64_sizes():
    with pytest.raises(ValueError, match=r"'archive/data/0' is compressed \(method 8: 5,000,000,000 bytes that "
                                         r"inflate to 6,000,000,000\)"):
        load(io.BytesIO(zip64_directory_entry(b"archive/data/0", 8, 5 * 10**9, 6 * 10**9)))
    with pytest.raises(ValueError, match=r"records claim 5,000,000,000 bytes in all, more than the file's"):
        load(io.BytesIO(zip64_directory_entry(b"archive/data/0", 0, 5 * 10**9, 5 * 10**9)))
