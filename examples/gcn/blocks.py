"""A node task's rows as plain .npy arrays, exported once, from which each rank reads its block.

    python -m examples.gcn.blocks --out synthetic_blocks                        # offline default
    python -m examples.gcn.blocks --dataset ogbn-products --root DIR --out products_blocks

The export loads the task through examples.gcn.train's loaders (same ``--dataset`` names, node
tasks only) and writes, in CSR by target row as ``block_of`` builds it::

    rowptr.npy        int64    [N + 1]
    col.npy           int32    [nonzeros]  (int64 when node ids pass int32)
    x.npy             float32  [N, features]
    y.npy             int64    [N, 1] class ids, or [N, tasks] 0/1 targets (rocauc)
    mask_<split>.npy  bool     [N]         one per split
    meta.json         format, version, num_nodes, num_features, num_outputs, metric,
                      train_count, dataset, splits

``read_block(folder, bounds, rank)`` memory-maps every array and copies out only the rank's
rows, so no rank reads more than its block's pages.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import types
import uuid
from pathlib import Path

import numpy as np
import torch

FORMAT = "torch_tcsparse.node_blocks"
VERSION = 1
META = "meta.json"
METRICS = ("acc", "rocauc")
REQUIRED_SPLITS = ("train", "valid", "test")
# A split's name becomes part of a file name: letters, digits and underscores only.
SPLIT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
# meta.json is a dozen fields; a larger file is not an export, and is not read into memory.
MAX_META_BYTES = 1 << 16
INT32_IDS = np.iinfo(np.int32).max + 1


def graph_csr(edge_index: torch.Tensor, num_nodes: int):
    """``(rowptr, col)`` of ``A[target, source]`` from a [2, E] edge_index."""
    target, source = edge_index[1], edge_index[0]
    order = torch.sort(target, stable=True).indices
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(target, minlength=num_nodes), 0, out=rowptr[1:])
    return rowptr, source[order]


def split_mask(index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[index] = True
    return mask


def block_of(task, bounds: tuple[int, ...], rank: int) -> types.SimpleNamespace:
    """This rank's block of ``task`` (``x``, ``y``, ``edge_index``, ``split``): the rows of node
    ids ``bounds[rank]:bounds[rank + 1]`` (columns in original ids), their features, labels and
    split membership, copied out so that the rest of the task can be dropped."""
    first, end = bounds[rank], bounds[rank + 1]
    num_nodes = task.x.size(0)
    rowptr, col = graph_csr(task.edge_index, num_nodes)
    block_rowptr = rowptr[first:end + 1] - rowptr[first]
    block_col = col[int(rowptr[first]):int(rowptr[end])].clone()
    masks = {name: split_mask(index, num_nodes)[first:end].clone() for name, index in task.split.items()}
    return types.SimpleNamespace(rowptr=block_rowptr, col=block_col, x=task.x[first:end].clone(),
                                 y=task.y[first:end].clone(), masks=masks, bounds=bounds,
                                 num_features=task.x.size(1), num_outputs=task.num_outputs, metric=task.metric,
                                 train_count=len(task.split["train"]))


# Writing.

def export(task, folder, dataset: str) -> Path:
    """Writes ``task`` (as examples.gcn.data loads it) into ``folder``: built in a temporary
    sibling and renamed into place. ``folder`` may be missing, empty or an earlier export; any
    other non-empty folder is refused, never overwritten."""
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset must be a non-empty str, got {dataset!r}")
    if task.metric not in METRICS:
        raise ValueError(f"the task's metric must be one of {METRICS}, got {task.metric!r}")
    if task.y.dtype.is_floating_point or task.y.dtype == torch.bool:
        raise ValueError(f"the task's labels must be integers, got dtype {task.y.dtype}")
    folder = Path(folder)
    num_nodes, num_features = task.x.shape
    y_shape = (num_nodes, label_columns(task.metric, task.num_outputs))
    if tuple(task.y.shape) != y_shape:
        raise ValueError(f"the task's labels must have shape {y_shape}, got {tuple(task.y.shape)}")
    meta = {"format": FORMAT, "version": VERSION, "num_nodes": num_nodes, "num_features": num_features,
            "num_outputs": int(task.num_outputs), "metric": task.metric, "train_count": len(task.split["train"]),
            "dataset": dataset, "splits": list(task.split)}
    _check_meta(meta, folder / META)
    _check_replaceable(folder)
    rowptr, col = graph_csr(task.edge_index, num_nodes)
    # Rows contiguous (C order), as a rank's slice of rows must be: ogb's loader hands x over transposed.
    arrays = {"rowptr": rowptr.numpy(), "col": col.numpy().astype(col_dtype(num_nodes)),
              "x": np.ascontiguousarray(task.x.float().numpy()), "y": np.ascontiguousarray(task.y.long().numpy())}
    arrays |= {f"mask_{name}": split_mask(index, num_nodes).numpy() for name, index in task.split.items()}
    folder.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name rather than mkdtemp's: the export keeps the folder's mode, and mkdtemp's is private.
    staging = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.partial")
    staging.mkdir()
    try:
        for name, array in arrays.items():
            np.save(staging / f"{name}.npy", array, allow_pickle=False)
        (staging / META).write_text(json.dumps(meta, indent=1))
        _replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def label_columns(metric: str, num_outputs: int) -> int:
    """y's columns: one class id per node, or one 0/1 target per task (ROC-AUC)."""
    return 1 if metric == "acc" else num_outputs


def col_dtype(num_nodes: int) -> np.dtype:
    return np.dtype(np.int32 if num_nodes <= INT32_IDS else np.int64)


def _file_names(splits) -> set[str]:
    return {META, "rowptr.npy", "col.npy", "x.npy", "y.npy", *(f"mask_{name}.npy" for name in splits)}


def _check_replaceable(folder: Path) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    entries = {entry.name for entry in folder.iterdir()}
    if not entries:
        return
    try:
        splits = read_meta(folder)["splits"]
    except ValueError as error:
        raise ValueError(f"{folder} is not empty and not a block export ({error}): choose another folder") from None
    foreign = sorted(entries - _file_names(splits))
    if foreign:
        raise ValueError(f"{folder} is a block export holding other files too ({foreign[0]}): choose another folder")


def _replace(staging: Path, folder: Path) -> None:
    if not folder.exists():
        os.rename(staging, folder)
        return
    # The earlier export is moved aside until the new one is in place: a failed rename puts it back.
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
    try:
        os.rename(folder, aside / folder.name)
        try:
            os.rename(staging, folder)
        except BaseException:
            os.rename(aside / folder.name, folder)
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


# Reading.

def read_meta(folder) -> dict:
    """The export's meta.json, every field checked."""
    path = Path(folder) / META
    if not path.is_file():
        raise ValueError(f"{path}: no such file (not a block export)")
    size = path.stat().st_size
    if size > MAX_META_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than a block export's meta ({MAX_META_BYTES})")
    try:
        meta = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    _check_meta(meta, path)
    return meta


def _check_meta(meta, path: Path) -> None:
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r}, got {meta.get('format')!r}")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: version must be {VERSION}, got {meta.get('version')!r}")
    num_nodes = _meta_int(meta, path, "num_nodes", 0)
    _meta_int(meta, path, "num_features", 1)
    _meta_int(meta, path, "num_outputs", 1)
    _meta_int(meta, path, "train_count", 1, num_nodes)
    if meta.get("metric") not in METRICS:
        raise ValueError(f"{path}: metric must be one of {METRICS}, got {meta.get('metric')!r}")
    if not isinstance(meta.get("dataset"), str) or not meta["dataset"]:
        raise ValueError(f"{path}: dataset must be a non-empty string, got {meta.get('dataset')!r}")
    splits = meta.get("splits")
    if not isinstance(splits, list) or len(set(map(str, splits))) != len(splits):
        raise ValueError(f"{path}: splits must be a list of distinct names, got {splits!r}")
    for name in splits:
        if not isinstance(name, str) or not SPLIT_NAME.fullmatch(name):
            raise ValueError(f"{path}: a split's name must be letters, digits and underscores, got {name!r}")
    if not set(REQUIRED_SPLITS) <= set(splits):
        raise ValueError(f"{path}: splits must include {REQUIRED_SPLITS}, got {splits!r}")


def _meta_int(meta: dict, path: Path, name: str, low: int, high: int | None = None) -> int:
    value = meta.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: {name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        limits = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{path}: {name} must be {limits}, got {value}")
    return value


def read_block(folder, bounds, rank: int) -> types.SimpleNamespace:
    """``block_of`` for an export: rank ``rank``'s rows ``bounds[rank]:bounds[rank + 1]``, read
    from memory-mapped arrays after checking every header against meta.json and the block's
    rows and columns. A folder that fails a check raises ValueError naming the file."""
    folder = Path(folder)
    meta = read_meta(folder)
    num_nodes, metric = meta["num_nodes"], meta["metric"]
    bounds = _check_bounds(bounds, rank, num_nodes)
    first, end = bounds[rank], bounds[rank + 1]
    rowptr = _open(folder / "rowptr.npy", np.int64, (num_nodes + 1,))
    col = _open(folder / "col.npy", col_dtype(num_nodes), (None,))
    x = _open(folder / "x.npy", np.float32, (num_nodes, meta["num_features"]))
    y = _open(folder / "y.npy", np.int64, (num_nodes, label_columns(metric, meta["num_outputs"])))
    mask_files = {name: _open(folder / f"mask_{name}.npy", np.bool_, (num_nodes,)) for name in meta["splits"]}

    block_rowptr = _block_rowptr(folder / "rowptr.npy", rowptr, first, end, col.shape[0])
    block_col = np.array(col[block_rowptr[0]:block_rowptr[-1]], dtype=np.int64)
    _check_columns(folder / "col.npy", block_col, num_nodes)
    block_y = np.array(y[first:end])
    _check_labels(folder / "y.npy", block_y, metric, meta["num_outputs"])
    # A bool file may hold bytes other than 0 and 1, which torch would carry into its masks as they are.
    masks = {name: torch.from_numpy(np.array(mask[first:end]).view(np.uint8) != 0) for name, mask in mask_files.items()}
    return types.SimpleNamespace(
        rowptr=torch.from_numpy(block_rowptr - block_rowptr[0]), col=torch.from_numpy(block_col),
        x=torch.from_numpy(np.array(x[first:end])), y=torch.from_numpy(block_y), masks=masks, bounds=bounds,
        num_features=meta["num_features"], num_outputs=meta["num_outputs"], metric=metric,
        train_count=meta["train_count"])


def _check_bounds(bounds, rank: int, num_nodes: int) -> tuple[int, ...]:
    if not isinstance(bounds, (tuple, list)):
        raise TypeError(f"bounds must be a tuple of ints, got {type(bounds).__name__}")
    for value in bounds:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"bounds must hold ints, got {value!r}")
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != num_nodes:
        raise ValueError(f"bounds must run from 0 to the export's {num_nodes} nodes, got {tuple(bounds)}")
    if any(a > b for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(f"bounds must be non-decreasing, got {tuple(bounds)}")
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {type(rank).__name__}")
    if not 0 <= rank < len(bounds) - 1:
        raise ValueError(f"rank must be in [0, {len(bounds) - 2}], got {rank}")
    return tuple(bounds)


def _open(path: Path, dtype, shape: tuple) -> np.ndarray:
    """The array in ``path`` memory-mapped, once its header shows ``dtype`` and ``shape`` (None:
    any length) and the file holds exactly the bytes the header promises."""
    dtype = np.dtype(dtype)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as file:
        try:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                found_shape, fortran_order, found_dtype = np.lib.format.read_array_header_1_0(file)
            elif version == (2, 0):
                found_shape, fortran_order, found_dtype = np.lib.format.read_array_header_2_0(file)
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except ValueError as error:
            raise ValueError(f"{path}: not a .npy array this reader takes ({error})") from None
        header_bytes = file.tell()
    if found_dtype != dtype:
        raise ValueError(f"{path}: dtype must be {dtype}, got {found_dtype}")
    matches = len(found_shape) == len(shape) and all(want in (None, got) for got, want in zip(found_shape, shape))
    if not matches or any(got < 0 for got in found_shape):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{path}: shape must be {wanted} (meta.json), got {found_shape}")
    if fortran_order and len(shape) > 1:
        raise ValueError(f"{path}: must be stored in C order (rows contiguous), got Fortran order")
    expected = header_bytes + int(np.prod(found_shape, dtype=object)) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise ValueError(f"{path}: holds {size} bytes, its header promises {expected}")
    return np.load(path, mmap_mode="r", allow_pickle=False)


def _block_rowptr(path: Path, rowptr: np.ndarray, first: int, end: int, num_col: int) -> np.ndarray:
    block = np.array(rowptr[first:end + 1])
    steps = np.diff(block)
    if steps.size and steps.min() < 0:
        row = first + int(np.argmax(steps < 0))
        raise ValueError(f"{path}: rowptr must be non-decreasing, got {int(rowptr[row])} at row {row} "
                         f"then {int(rowptr[row + 1])}")
    if block[0] < 0 or block[-1] > num_col:
        raise ValueError(f"{path}: rowptr must lie in [0, {num_col}] (col.npy's length), got "
                         f"{int(block[0])}..{int(block[-1])} for rows {first}:{end}")
    return block


def _check_columns(path: Path, col: np.ndarray, num_nodes: int) -> None:
    outside = (col < 0) | (col >= num_nodes)
    if outside.any():
        raise ValueError(f"{path}: columns must be node ids in [0, {num_nodes}), got {int(col[np.argmax(outside)])}")


def _check_labels(path: Path, y: np.ndarray, metric: str, num_outputs: int) -> None:
    high = num_outputs if metric == "acc" else 2
    outside = (y < 0) | (y >= high)
    if outside.any():
        kind = f"class ids in [0, {num_outputs})" if metric == "acc" else "0/1 targets"
        raise ValueError(f"{path}: labels must be {kind}, got {int(y[outside][0])}")


def main(argv=None) -> Path:
    # The loaders need PyG and ogb; reading blocks does not, so they load here.
    from examples.gcn import data as datasets
    from examples.gcn import train as single

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synthetic",
                        help="as in examples.gcn.train: synthetic, Cora, ogbn-arxiv, ... or a dataset folder")
    parser.add_argument("--root", default=None, help="folder holding the dataset's folder, only read")
    parser.add_argument("--out", required=True, help="folder to write: missing, empty or an earlier export")
    args = parser.parse_args(argv)
    load_args = single.parse_args(["--dataset", args.dataset] + ([] if args.root is None else ["--root", args.root]))
    task_kind = single.resolve_config(load_args)["task"]
    if task_kind != "node":
        raise SystemExit(f"error: blocks are exported for node tasks; {args.dataset} is a {task_kind} task")
    try:
        task = single.load_task(load_args)
        folder = export(task, args.out, args.dataset)
    except (datasets.MissingData, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{args.dataset}: {task.x.size(0)} nodes, {task.edge_index.size(1)} nonzeros, {task.x.size(1)} features "
          f"-> {folder}")
    return folder


if __name__ == "__main__":
    main()
