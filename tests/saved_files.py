"""Saved TCSparseTensor files and the ways the loader fuzzer damages them: edits of the saved
state (what a crafted file can claim: strides, lengths, dtypes, shapes, swapped or shared arrays)
and edits of the archive's bytes (flipped, truncated, dropped or swapped records)."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import random_coo, random_permutation

ARRAYS = ("rowptr", "col", "values", "row_perm")
# The largest length an expanded or regrown array claims: materialised, it would cost far more
# than the memory bound the fuzzer checks, yet not enough to endanger the machine running it.
LARGEST_CLAIM = 2**22


class Crafted:
    """Pickles as a TCSparseTensor with the given saved state."""

    def __init__(self, state: dict):
        self.state = state

    def __reduce_ex__(self, protocol):
        from torch_tcsparse.serialization import rebuild

        return rebuild, (self.state,)


def random_matrix(rng: np.random.Generator) -> TCSparseTensor:
    """A small matrix with random options: rectangular or square, empty rows or none at all,
    any value dtype, window 8 or 16, a user permutation or none."""
    num_rows, num_cols = int(rng.integers(0, 40)), int(rng.integers(0, 40))
    dtype = [torch.float16, torch.bfloat16, torch.float32, torch.float64][rng.integers(4)]
    row, col, values = random_coo(num_rows, num_cols, float(rng.uniform(0, 0.4)), int(rng.integers(2**31)), dtype)
    options = dict(window=int(rng.choice([8, 16])))
    if num_rows and rng.random() < 0.4:
        options |= dict(reorder=random_permutation(num_rows, int(rng.integers(2**31))), symmetric=False)
    return TCSparseTensor.from_coo(row, col, values, shape=(num_rows, num_cols), **options)


def state_of(matrix: TCSparseTensor) -> dict:
    _, (state,) = matrix.__reduce_ex__(2)
    return dict(state)


def save(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def logical_size(data: bytes) -> int:
    """What the file holds once unpacked: its records' sizes, or its length if not an archive."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return max(len(data), sum(info.file_size for info in archive.infolist()))
    except (zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError):
        return len(data)


# Edits of the saved state.


def _some_array(rng, state) -> str:
    present = [name for name in ARRAYS if isinstance(state.get(name), torch.Tensor)]
    return str(rng.choice(present))


def _claim(rng) -> int:
    return int(rng.choice([0, 1, 2, 3, 17, 2**16, LARGEST_CLAIM]))


def expand(rng, state):
    name = _some_array(rng, state)
    array = state[name]
    entry = array.reshape(-1)[:1] if array.numel() else torch.zeros(1, dtype=array.dtype)
    return state | {name: entry.expand(_claim(rng))}


def claim_rows(rng, state):
    """A shape of LARGEST_CLAIM empty rows, its rowptr one expanded zero: consistent lengths, so
    only the stride shows that the file does not hold what it claims."""
    num_cols = int(rng.integers(0, 9))
    rowptr = torch.zeros(1, dtype=torch.int32).expand(LARGEST_CLAIM + 1)
    empty = dict(col=torch.zeros(0, dtype=torch.int32), values=torch.zeros(0), row_perm=None)
    return state | dict(shape=(LARGEST_CLAIM, num_cols), rowptr=rowptr) | empty


def claim_entries(rng, state):
    """One row of LARGEST_CLAIM entries, its columns and values expanded from one entry each."""
    columns = torch.zeros(1, dtype=torch.int32).expand(LARGEST_CLAIM)
    values = torch.ones(1, dtype=torch.float32).expand(LARGEST_CLAIM)
    rowptr = torch.tensor([0, LARGEST_CLAIM], dtype=torch.int32)
    return state | dict(shape=(1, int(rng.integers(1, 9))), rowptr=rowptr, col=columns, values=values, row_perm=None)


def stride(rng, state):
    name = _some_array(rng, state)
    step = int(rng.integers(2, 4))
    spread = state[name].repeat_interleave(step)
    return state | {name: spread[int(rng.integers(step))::step]}


def offset_view(rng, state):
    """The array as a view into the middle of a larger storage (what a slice saves)."""
    name = _some_array(rng, state)
    array, pad = state[name].reshape(-1), int(rng.integers(1, 9))
    storage = torch.cat([torch.zeros(pad, dtype=array.dtype), array, torch.zeros(pad, dtype=array.dtype)])
    start = int(rng.integers(0, 2 * pad + 1))
    return state | {name: storage[start:start + array.numel()]}


def resize(rng, state):
    name = _some_array(rng, state)
    array = state[name].reshape(-1)
    length = max(0, array.numel() + int(rng.choice([-2, -1, 1, 2]))) if rng.random() < 0.8 else _claim(rng)
    grown = torch.cat([array, array.new_zeros(max(0, length - array.numel()))])
    return state | {name: grown[:length].clone()}


def two_dimensional(rng, state):
    name = _some_array(rng, state)
    return state | {name: state[name].unsqueeze(int(rng.integers(2)))}


def retype(rng, state):
    name = _some_array(rng, state)
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
    array = state[name].real if state[name].is_complex() else state[name]
    return state | {name: array.to(dtypes[rng.integers(len(dtypes))])}


def poke(rng, state):
    """One entry of one array replaced by an extreme or nearby value."""
    name = _some_array(rng, state)
    array = state[name].clone()
    if array.numel() == 0 or array.dtype == torch.bool or array.dtype.is_complex:
        return state
    flat, position = array.view(-1), int(rng.integers(array.numel()))
    if array.dtype.is_floating_point:
        value = float(rng.choice([np.inf, -np.inf, np.nan, 0.0, 1e30, -3.5]))
    else:
        # Integer candidates only for integer arrays: int() of an inf an earlier poke left in a
        # float array would raise.
        candidates = [-1, 0, 1, array.numel(), 2**31 - 1, -(2**31)] + [int(flat[position]) + d for d in (-1, 1)]
        info = torch.iinfo(array.dtype)
        value = min(max(candidates[rng.integers(len(candidates))], info.min), info.max)
    flat[position] = value
    return state | {name: array}


def swap(rng, state):
    first, second = (str(name) for name in rng.choice(list(ARRAYS), size=2, replace=False))
    return state | {first: state.get(second), second: state.get(first)}


def share(rng, state):
    """Two arrays as views of one storage."""
    first, second = (str(name) for name in rng.choice(["rowptr", "col", "row_perm"], size=2, replace=False))
    source = state.get(first)
    if not isinstance(source, torch.Tensor) or source.numel() == 0:
        return state
    start = int(rng.integers(source.numel()))
    return state | {second: source[start:]}


def reshape(rng, state):
    shape = state.get("shape")
    plain = isinstance(shape, tuple) and len(shape) == 2 and all(type(size) is int for size in shape)
    num_rows, num_cols = shape if plain else (3, 3)
    shapes = [
        (num_rows + 1, num_cols), (max(num_rows - 1, 0), num_cols), (num_rows, num_cols + 5), (num_rows, 0),
        (num_rows, -1), (num_rows, 2**62), (2**40, 2**40), (float(num_rows), num_cols), (num_rows,),
        (num_rows, num_cols, 1), [num_rows, num_cols], (num_rows, True), (str(num_rows), num_cols),
        (num_rows, LARGEST_CLAIM),
    ]
    return state | {"shape": shapes[rng.integers(len(shapes))]}


def option(rng, state):
    edits = [
        {"window": 5}, {"window": 16.0}, {"window": 8}, {"window": "16"}, {"symmetric": True},
        {"symmetric": "yes"}, {"method": 7}, {"method": "rcm"}, {"version": 0}, {"row_perm": "auto"},
        {"values": None}, {"values": [1.0]}, {"shape": None},
    ]
    return state | edits[rng.integers(len(edits))]


def drop_key(rng, state):
    state = dict(state)
    del state[str(rng.choice(list(state)))]
    return state


STATE_EDITS = (expand, claim_rows, claim_entries, stride, offset_view, resize, two_dimensional, retype, poke, swap, share, reshape,
               option, drop_key)


# Edits of the archive's bytes.


def records_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zipped(records: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, record in records.items():
            archive.writestr(name, record)
    return buffer.getvalue()


def _flipped(rng, record: bytes, count: int) -> bytes:
    flipped = bytearray(record)
    for _ in range(count if flipped else 0):
        flipped[rng.integers(len(flipped))] ^= 1 << int(rng.integers(8))
    return bytes(flipped)


def flip_file_bytes(rng, data):
    return _flipped(rng, data, int(rng.integers(1, 4)))


def flip_record_bytes(rng, data):
    records = records_of(data)
    name = str(rng.choice(list(records)))
    return zipped(records | {name: _flipped(rng, records[name], int(rng.integers(1, 4)))})


def truncate_file(rng, data):
    return data[: int(rng.integers(len(data)))]


def truncate_record(rng, data):
    records = records_of(data)
    name = str(rng.choice(list(records)))
    return zipped(records | {name: records[name][: int(rng.integers(len(records[name]) + 1))]})


def drop_record(rng, data):
    records = records_of(data)
    del records[str(rng.choice(list(records)))]
    return zipped(records)


def swap_records(rng, data):
    records = records_of(data)
    storages = [name for name in records if "/data/" in name and not name.endswith(".pkl")]
    if len(storages) < 2:
        return data
    first, second = (str(name) for name in rng.choice(storages, size=2, replace=False))
    return zipped(records | {first: records[second], second: records[first]})


BYTE_EDITS = (flip_file_bytes, flip_record_bytes, truncate_file, truncate_record, drop_record, swap_records)
