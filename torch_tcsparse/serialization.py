"""Saved TCSparseTensors: only the canonical CSR, the permutation and the options travel; on load
every array is validated and the matrix rebuilt, so a crafted file cannot plant out-of-range
indices in a kernel's input.

Two entry points, two guarantees:

- ``torch_tcsparse.load(f)`` reads the archive's directory before torch reads a record, and
  refuses a compressed record (torch.save stores every record as it is: a compressed one is a
  bomb that torch would inflate before anything could check it), records whose sizes add up to
  more than the file, too many records and an oversized pickle. What torch then allocates is
  bounded by the file, and loading peaks at ``2 * size + 50 MB`` (a saved row permutation adds
  the Tensor-Core layout, which the matrix then builds at load).
- ``torch.load(f, weights_only=True)`` reaches ``rebuild`` only once torch has read the archive
  and inflated its records: the matrix is validated in memory bounded by what torch read, not by
  the file. Files from elsewhere go through ``torch_tcsparse.load``.

The unpickler hands ``rebuild`` tensors that are already views of the file's storages, and a view
may claim far more entries than its storage holds bytes (a stride of 0 repeats one entry). Every
array's layout and length are therefore checked against its storage and the saved shape before
any operation reads it. A loaded matrix holds its CSR and builds its Tensor-Core layout on the
first product that needs it (``structure.CsrStructure``), so loading costs memory in proportion to
the file."""
from __future__ import annotations

import io
import os
import struct
import zipfile

import torch

from .conversion import build_loaded_structure
from .formats.csr import checked_canonical
from .formats.inputs import check_shape

SAVE_FORMAT_VERSION = 1
INDEX_DTYPES = (torch.int32, torch.int64)
# Columns a saved matrix may have beyond its rows and nonzeros. No array of the file stores them,
# yet a transpose holds an offset per column: beyond this, a small file would make A.t() allocate
# without bound.
MAX_EMPTY_COLUMNS = 2**22
# Records of an archive torch_tcsparse.load reads (a torch.save file has one per tensor storage,
# plus four): torch keeps a name and an offset per record, whatever the record holds.
MAX_RECORDS = 2**16
# Bytes of a pickle torch_tcsparse.load reads: torch's restricted unpickler builds up to about 20
# bytes of Python objects per byte of pickle (a dict of small ints). A saved matrix's pickle
# takes a few hundred bytes, a state dict about 150 per tensor.
MAX_PICKLE_BYTES = 2**21

# The end of a zip archive's central directory: its signature, disk numbers, entries on this
# disk and in all, the directory's size and offset, the comment's length; and zip64's locator
# and end record, which hold those fields where they overflow the 16- and 32-bit ones. Parsed
# here rather than by zipfile, which builds an object per entry of however long a directory.
_END = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")
_LONGEST_COMMENT = 2**16 - 1
# A central directory's entry: signature, versions, flags, method, time, date, CRC, stored and
# inflated sizes, lengths of the name, extra field and comment, disk, attributes, offset.
_RECORD = struct.Struct("<4s4H2H3L5H2L")


def state_of(structure, values: torch.Tensor) -> dict:
    """What ``torch.save`` stores of a matrix with this structure and CSR-order values."""
    s = structure
    check_width(s.num_rows, s.num_cols, s.nnz)
    return {
        "version": SAVE_FORMAT_VERSION,
        "shape": (s.num_rows, s.num_cols),
        "rowptr": _own_bytes(s.rowptr),
        "col": _own_bytes(s.col),
        "values": _own_bytes(values.detach().contiguous()),
        "window": s.window,
        "row_perm": s.row_perm,
        "symmetric": s.col_perm is not None,
        "method": s.method,
    }


def _own_bytes(array: torch.Tensor) -> torch.Tensor:
    """``array``, copied where it is a view of a larger storage (a sampled batch's later blocks
    read prefixes of the first block's arrays): torch.save writes a view's whole storage."""
    if array.untyped_storage().nbytes() == array.numel() * array.element_size():
        return array
    return array.clone()


def load(f, map_location=None):
    """``torch.load(f, weights_only=True)`` of a file from anywhere: the archive is checked first
    (``check_archive``), and every failure on a damaged file is a ``ValueError``.

    torch reads the archive (its zip directory, every record, the pickle, every tensor's view of
    its storage) before any saved matrix is rebuilt, and on damaged bytes its reader and
    restricted unpickler raise whatever they meet (RuntimeError, UnpicklingError, KeyError,
    EOFError...). An ``OSError`` is not about the file's content (a missing file, a failing disk)
    and passes through."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as file:
            return _checked_load(file, map_location)
    if not all(hasattr(f, name) for name in ("read", "seek", "tell")):
        raise TypeError(f"load expects a path or a binary file opened for reading, got {type(f).__name__}")
    return _checked_load(f, map_location)


def _checked_load(file, map_location):
    start = file.tell()
    check_archive(file)
    file.seek(start)
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except (ValueError, OSError):
        raise
    except Exception as error:
        raise ValueError(f"not a readable torch file: {type(error).__name__}: {error}") from error


def check_archive(file) -> None:
    """``ValueError`` unless ``file`` (a seekable binary file, read from where it stands) is a zip
    archive that torch may read in memory bounded by its size: at most ``MAX_RECORDS`` records,
    each stored uncompressed (as torch.save writes them), their sizes adding up to at most the
    file's, every pickle at most ``MAX_PICKLE_BYTES``. Reads the directory one record at a time,
    in constant memory, as many records as the archive's end declares (all torch reads)."""
    start = file.tell()
    size = file.seek(0, io.SEEK_END) - start
    count, directory = _directory(file, start, size)
    if count > MAX_RECORDS:
        raise ValueError(f"refused torch file: its archive has {count:,} records, more than the {MAX_RECORDS:,} "
                         "torch_tcsparse.load reads (use torch.load for a file you trust)")
    file.seek(start + directory)
    total = 0
    for _ in range(count):
        name, method, compressed, inflated = _next_record(file)
        if method != zipfile.ZIP_STORED:
            raise ValueError(
                f"refused torch file: record {name!r} is compressed (method {method}: {compressed:,} bytes that "
                f"inflate to {inflated:,}); torch.save stores every record uncompressed, and torch would inflate it "
                "whole before anything could check it"
            )
        if compressed != inflated:
            raise ValueError(f"refused torch file: record {name!r} is stored with {compressed:,} bytes but claims "
                             f"{inflated:,}")
        if name.endswith(".pkl") and inflated > MAX_PICKLE_BYTES:
            raise ValueError(f"refused torch file: its pickle {name!r} has {inflated:,} bytes, more than the "
                             f"{MAX_PICKLE_BYTES:,} torch_tcsparse.load reads (use torch.load for a file you trust)")
        total += inflated
    if total > size:
        raise ValueError(f"refused torch file: its records claim {total:,} bytes in all, more than the file's {size:,} "
                         "(records that share bytes)")


def _directory(file, start: int, size: int) -> tuple[int, int]:
    """(records, offset of the central directory) that the archive's end declares, zip64's where
    the classic fields overflow."""
    tail_size = min(size, _END.size + _LONGEST_COMMENT)
    file.seek(start + size - tail_size)
    tail = file.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _END.size > len(tail):
        raise ValueError("not a readable torch file: no zip directory (torch.save writes a zip archive)")
    *_, count, _, offset, _ = _END.unpack_from(tail, at)
    if count == 0xFFFF or offset == 0xFFFFFFFF:
        locator_at = size - tail_size + at - _ZIP64_LOCATOR.size
        file.seek(start + max(locator_at, 0))
        locator = file.read(_ZIP64_LOCATOR.size)
        if locator_at < 0 or len(locator) < _ZIP64_LOCATOR.size or locator[:4] != b"PK\x06\x07":
            raise ValueError("not a readable torch file: its zip64 directory is missing")
        end_at = _ZIP64_LOCATOR.unpack(locator)[2]
        file.seek(start + end_at)
        end = file.read(_ZIP64_END.size)
        if len(end) < _ZIP64_END.size or end[:4] != b"PK\x06\x06":
            raise ValueError("not a readable torch file: its zip64 directory is damaged")
        *_, count, _, offset = _ZIP64_END.unpack(end)
    if offset >= size:
        raise ValueError(f"not a readable torch file: its zip directory starts at {offset:,}, past its end ({size:,})")
    return count, offset


def _next_record(file) -> tuple[str, int, int, int]:
    """(name, compression method, stored size, inflated size) of the directory entry at the file's
    position, which then moves past it."""
    header = file.read(_RECORD.size)
    if len(header) < _RECORD.size or header[:4] != b"PK\x01\x02":
        raise ValueError("not a readable torch file: its zip directory is damaged")
    method, compressed, inflated, name_length, extra_length, comment_length = (
        _RECORD.unpack(header)[i] for i in (4, 8, 9, 10, 11, 12))
    name = file.read(name_length).decode("utf-8", "replace")
    extra = file.read(extra_length)
    file.seek(comment_length, io.SEEK_CUR)
    # zip64 keeps a size that overflows 32 bits in an extra field (id 1): the inflated size
    # first, then the stored one, each present only where its classic field overflows.
    wide = [field == 0xFFFFFFFF for field in (inflated, compressed)]
    at = 0
    while any(wide) and at + 4 <= len(extra):
        kind, length = struct.unpack_from("<2H", extra, at)
        if kind == 1:
            values = iter(struct.unpack_from(f"<{min(length // 8, 2)}Q", extra, at + 4))
            inflated = next(values, inflated) if wide[0] else inflated
            compressed = next(values, compressed) if wide[1] else compressed
            break
        at += 4 + length
    return name, method, compressed, inflated


def rebuild(state: dict):
    """The matrix a saved ``state`` describes, validated; ``ValueError`` for a corrupted file."""
    from .tensor import TCSparseTensor

    if not isinstance(state, dict) or state.get("version") != SAVE_FORMAT_VERSION:
        raise ValueError(f"not a saved TCSparseTensor of format version {SAVE_FORMAT_VERSION}")
    try:
        num_rows, num_cols = _shape(state["shape"])
        rowptr, col, values = (_array(name, state[name]) for name in ("rowptr", "col", "values"))
        row_perm = None if state["row_perm"] is None else _array("row_perm", state["row_perm"])
        _check_index_dtypes(rowptr=rowptr, col=col, row_perm=row_perm)
        _check_lengths(rowptr, col, values, row_perm, num_rows)
        _check_disjoint({"rowptr": rowptr, "col": col, "values": values, "row_perm": row_perm})
        check_width(num_rows, num_cols, col.numel())
        window, symmetric, method = state["window"], state["symmetric"], state["method"]
        if not isinstance(symmetric, bool) or not isinstance(method, str):
            raise TypeError(f"symmetric must be a bool and method a str, got {symmetric!r} and {method!r}")
        csr = checked_canonical(rowptr, col, values, num_rows, num_cols)
        structure = build_loaded_structure(csr, window, row_perm, symmetric)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"corrupted TCSparseTensor file: {error}") from error
    structure.method = method
    return TCSparseTensor(structure, csr.values)


def check_width(num_rows: int, num_cols: int, nnz: int) -> None:
    """A saved matrix has at most ``MAX_EMPTY_COLUMNS`` columns beyond its rows and nonzeros: what
    its transpose allocates per column stays within a bound of what the file stores."""
    if num_cols > num_rows + nnz + MAX_EMPTY_COLUMNS:
        raise ValueError(
            f"a saved matrix of {num_rows} rows and {nnz} nonzeros may have at most num_rows + nnz + "
            f"{MAX_EMPTY_COLUMNS} columns, got {num_cols}: its transpose would hold an offset per column, "
            "which no array of the file stores"
        )


def _shape(shape) -> tuple[int, int]:
    if not isinstance(shape, tuple) or len(shape) != 2:
        raise ValueError(f"shape must be a pair (num_rows, num_cols), got {shape!r}")
    return check_shape(*shape)


def _array(name: str, array) -> torch.Tensor:
    """``array`` if it is a 1-D tensor whose every entry has bytes of its own in its storage. A
    positive stride cannot repeat an entry, so strided values (of ``with_values`` on a view) load."""
    if not isinstance(array, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(array).__name__}")
    if array.layout != torch.strided or array.dim() != 1:
        raise ValueError(f"{name} must be a 1-D dense tensor, got layout {array.layout} and shape {tuple(array.shape)}")
    if array.numel() > 1 and array.stride(0) < 1:
        raise ValueError(f"{name} must store each of its {array.numel()} entries once, got an expanded tensor (stride 0)")
    if array.storage_offset() < 0 or _end(array) > array.untyped_storage().nbytes():
        raise ValueError(
            f"{name} claims {array.numel()} entries from offset {array.storage_offset()} of a storage of "
            f"{array.untyped_storage().nbytes()} bytes"
        )
    return array


def _end(array: torch.Tensor) -> int:
    """Where ``array``'s last entry ends in its storage, in bytes."""
    extent = (array.numel() - 1) * array.stride(0) + 1 if array.numel() else 0
    return (array.storage_offset() + extent) * array.element_size()


def _check_index_dtypes(**arrays) -> None:
    """Index arrays are saved as int32 or int64; a narrower type would let a small file claim
    rows whose rebuild (in int64) costs many times its bytes."""
    for name, array in arrays.items():
        if array is not None and array.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64 as saved, got {array.dtype}")


def _check_lengths(rowptr, col, values, row_perm, num_rows: int) -> None:
    if rowptr.numel() != num_rows + 1:
        raise ValueError(f"rowptr has {rowptr.numel()} entries, expected num_rows + 1 = {num_rows + 1}")
    if values.numel() != col.numel():
        raise ValueError(f"values must have one entry per nonzero ({col.numel()}), got shape {tuple(values.shape)}")
    if row_perm is not None and row_perm.numel() != num_rows:
        raise ValueError(f"row_perm must be a permutation of {num_rows} entries, got {row_perm.numel()}")


def _check_disjoint(arrays: dict) -> None:
    """No two arrays share bytes: each entry of the file is one entry of one array."""
    spans = []
    for name, array in arrays.items():
        if array is None or array.numel() == 0:
            continue
        base = array.untyped_storage().data_ptr()
        spans.append((base + array.storage_offset() * array.element_size(), base + _end(array), name))
    spans.sort()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"{name} and {other} overlap in the file's storage")


torch.serialization.add_safe_globals([rebuild])
