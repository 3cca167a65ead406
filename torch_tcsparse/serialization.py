"""Saved TCSparseTensors: only the canonical CSR, the permutation and the options travel; on load
every array is validated and the layout rebuilt, so a crafted file cannot plant out-of-range
indices in a kernel's input.

The unpickler hands ``rebuild`` tensors that are already views of the file's storages, and a view
may claim far more entries than its storage holds bytes (a stride of 0 repeats one entry). Every
array's layout and length are therefore checked against its storage and the saved shape before
any operation reads it, so loading costs memory in proportion to what the file stores."""
from __future__ import annotations

import torch

from .conversion import build_structure
from .formats.csr import from_csr_arrays
from .formats.inputs import check_shape

SAVE_FORMAT_VERSION = 1
INDEX_DTYPES = (torch.int32, torch.int64)


def state_of(structure, values: torch.Tensor) -> dict:
    """What ``torch.save`` stores of a matrix with this structure and CSR-order values."""
    s = structure
    return {
        "version": SAVE_FORMAT_VERSION,
        "shape": (s.num_rows, s.num_cols),
        "rowptr": s.rowptr,
        "col": s.col,
        "values": values.detach().contiguous(),
        "window": s.window,
        "row_perm": s.row_perm,
        "symmetric": s.col_perm is not None,
        "method": s.method,
    }


def load(f, map_location=None):
    """``torch.load(f, weights_only=True)`` whose failures on a damaged file are ``ValueError``.

    torch itself reads the archive (its zip directory, the size of every record, the pickle,
    every tensor's view of its storage) before any saved matrix is rebuilt, and on damaged bytes
    its reader and restricted unpickler raise whatever they meet (RuntimeError, UnpicklingError,
    KeyError, EOFError...). An ``OSError`` is not about the file's content (a missing file, a
    failing disk) and passes through."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except (ValueError, OSError):
        raise
    except Exception as error:
        raise ValueError(f"not a readable torch file: {type(error).__name__}: {error}") from error


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
        window, symmetric, method = state["window"], state["symmetric"], state["method"]
        if not isinstance(symmetric, bool) or not isinstance(method, str):
            raise TypeError(f"symmetric must be a bool and method a str, got {symmetric!r} and {method!r}")
        csr = from_csr_arrays(rowptr, col, values, num_rows, num_cols, values.dtype)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"corrupted TCSparseTensor file: {error}") from error
    if csr.nnz != values.numel() or not torch.equal(csr.col.long(), col.long()):
        raise ValueError("corrupted TCSparseTensor file: its CSR is not canonical (unsorted or duplicated)")
    reorder = "none" if row_perm is None else row_perm
    try:
        structure = build_structure(csr, window, reorder, symmetric, 0)
    except (TypeError, ValueError) as error:
        raise ValueError(f"corrupted TCSparseTensor file: {error}") from error
    structure.method = method
    return TCSparseTensor(structure, csr.values)


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
