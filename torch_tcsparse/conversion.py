"""From canonical CSR and the user's options (window, reorder, symmetric) to a ``Structure``:
the options are checked here, once, for every constructor and for a loaded file."""
from __future__ import annotations

import numpy as np
import torch

from . import kernels
from .formats import inputs
from .formats.csr import CSR, cast_values, index_dtype_for
from .formats.metcf import WINDOWS
from .paths import VALUE_DTYPES
from .structure import CsrStructure, Structure


def build_structure(csr: CSR, window: int, reorder, symmetric: bool | None, seed: int) -> Structure:
    window, symmetric, seed = check_options(window, symmetric, seed)
    if symmetric is None:
        symmetric = csr.num_rows == csr.num_cols
    if symmetric and csr.num_rows != csr.num_cols:
        raise ValueError(f"symmetric reordering needs a square matrix, got {csr.num_rows} x {csr.num_cols}")
    method, row_perm, share_ratio = choose_order(csr, reorder, symmetric, window, seed)
    col_perm = row_perm if (symmetric and row_perm is not None) else None
    structure = Structure(csr, window, row_perm, col_perm, method, share_ratio)
    structure.prepare_selection()
    return structure


def build_loaded_structure(csr: CSR, window, row_perm: torch.Tensor | None, symmetric: bool) -> Structure:
    """The structure of a loaded matrix (``serialization.rebuild``): without a row permutation its
    CSR alone, the Tensor-Core layout built when a product needs it (``structure.CsrStructure``),
    so that loading costs memory in proportion to the file; with one, as any constructor builds it."""
    window, symmetric, _ = check_options(window, symmetric, 0)
    if row_perm is not None:
        return build_structure(csr, window, row_perm, symmetric, 0)
    return CsrStructure(csr.rowptr, csr.col, csr.num_rows, csr.num_cols, window)


def build_batch_structure(edge_index, edge_weight, num_nodes, dtype, window) -> tuple[CsrStructure, torch.Tensor]:
    """The structure and CSR-order values of a matrix used a few times
    (``TCSparseTensor.from_batch``, arguments as ``from_edge_index``'s): its CSR, the Tensor-Core
    layout built only when a product needs it (``structure.CsrStructure``)."""
    window, _, _ = check_options(window, None, 0)
    # The one-sort build saves host reads, which cost a synchronisation on a GPU only.
    on_gpu = isinstance(edge_index, torch.Tensor) and edge_index.is_cuda
    built = _distinct_edges_csr(edge_index, edge_weight, num_nodes, dtype) if on_gpu else None
    if built is None:
        csr, longest = inputs.from_edge_index(edge_index, edge_weight, num_nodes, dtype), None
    else:
        csr, longest = built
    return CsrStructure(csr.rowptr, csr.col, csr.num_rows, csr.num_cols, window, longest), csr.values


def sampled_structures(edge_index: torch.Tensor, sizes: list[tuple[int, int, int]], longest: list[int],
                       dtype: torch.dtype | None, window: int = 16) -> list[tuple[CsrStructure, torch.Tensor]]:
    """``build_batch_structure`` for blocks of a batch ``loader.NeighborSampler`` drew: per block
    of ``sizes`` (``(num_sources, num_targets, num_edges)``), its structure and unit values in
    ``dtype``; ``longest``: each block's longest row, which the sampler read. ``edge_index``
    holds the first block's edges, and every block's CSR is the first ``num_targets`` rows and
    ``num_edges`` nonzeros of the first's (hops are appended in order, and hop h's targets are the
    nodes hop h - 1 found, so a block of fewer hops is a prefix of one of more, in rows and in the
    row-major sort): one sort serves them all, and every later block's indices are views of the
    first's (never written). Each block has its own unit values: a write to one block's values
    must not reach another's.

    The sampler guarantees what the public route checks with a host read (indices in range, no
    repeated edge, the targets ascending), so nothing here waits for the device. Each row's
    columns are sorted, as the Tensor-Core layout needs them: on CUDA by a thread per row where
    rows are short (``kernels.sort_row_sources``), else by the row-major keys' sort; the rows are
    the targets as they come, so rowptr is read off them in one op."""
    num_sources, num_targets, num_edges = sizes[0]
    index_dtype = index_dtype_for(num_targets, num_sources, num_edges)
    source, target = edge_index.unbind()
    rowptr = torch._convert_indices_from_coo_to_csr(target, num_targets, out_int32=index_dtype == torch.int32)
    if kernels.sorts_row_sources(source, longest[0]):
        col = kernels.sort_row_sources(rowptr, source, longest[0])
    elif index_dtype == torch.int32:
        # Every index fits 31 bits: the key target * 2**32 + source sorts as the row-major key,
        # and its cast to int32 keeps its low 32 bits, the source: one op, where the key of the
        # int64 route needs a remainder (and would need a cast).
        col = torch.sort(torch.add(source, target, alpha=2**32)).values.to(torch.int32)
    else:
        col = torch.remainder(torch.sort(torch.add(source, target, alpha=num_sources)).values, max(num_sources, 1))
    structures = []
    for (num_sources, num_targets, num_edges), longest_row in zip(sizes, longest):
        # Views only where the block is shorter: the first block keeps the arrays themselves.
        block_rowptr = rowptr if num_targets + 1 == rowptr.numel() else rowptr[: num_targets + 1]
        block_col = col if num_edges == col.numel() else col[:num_edges]
        if index_dtype != torch.int32 and index_dtype_for(num_targets, num_sources, num_edges) == torch.int32:
            block_rowptr, block_col = block_rowptr.to(torch.int32), block_col.to(torch.int32)
        values = torch.ones(num_edges, dtype=dtype or torch.float32, device=col.device)
        structures.append((CsrStructure(block_rowptr, block_col, num_targets, num_sources, window, longest_row),
                           values))
    return structures


def _distinct_edges_csr(edge_index, edge_weight, num_nodes, dtype) -> tuple[CSR, int] | None:
    """(canonical CSR, its longest row) of a plain [2, E] ``edge_index`` whose sizes are given as
    a (num_sources, num_targets) pair or an int, with distinct edges (a sampler draws without
    replacement): one sort of the row-major keys and one host read for every check, where the
    general conversion reads the host several times. None where any of that does not hold
    (sizes to infer, an EdgeIndex, integer or mismatched weights, duplicates to sum, an index
    out of range): ``inputs.from_edge_index`` then converts, or names what is wrong."""
    if isinstance(num_nodes, (tuple, list)) and len(num_nodes) == 2:
        num_src, num_dst = num_nodes
    else:
        num_src = num_dst = num_nodes
    plain_sizes = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (num_src, num_dst))
    if not plain_sizes or type(edge_index) is not torch.Tensor or edge_index.dtype not in (torch.int32, torch.int64):
        return None
    if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.shape[1] == 0:
        return None
    if dtype is not None and dtype not in VALUE_DTYPES:
        return None
    num_edges, device = edge_index.shape[1], edge_index.device
    if edge_weight is not None and not (isinstance(edge_weight, torch.Tensor) and edge_weight.dtype in VALUE_DTYPES
                                        and edge_weight.shape == (num_edges,) and edge_weight.device == device):
        return None
    try:
        inputs.check_shape(num_dst, num_src)
    except ValueError:
        return None
    key = edge_index[1].to(torch.long) * num_src + edge_index[0]
    if edge_weight is None:
        key, order = torch.sort(key).values, None
    else:
        key, order = torch.sort(key)
    row = torch.div(key, num_src, rounding_mode="floor")
    index_dtype = index_dtype_for(num_dst, num_src, num_edges)
    rowptr = torch.searchsorted(row, torch.arange(num_dst + 1, device=device), out_int32=index_dtype == torch.int32)
    # Every check in one read: both indices' ranges (each read as given: a target out of range
    # may wrap its key into range), a repeated key, the longest row.
    sources, targets = torch.aminmax(edge_index[0]), torch.aminmax(edge_index[1])
    checks = torch.cat([torch.stack([sources.min, sources.max, targets.min, targets.max]).long(),
                        (key[1:] == key[:-1]).any().long().view(1), (rowptr[1:] - rowptr[:-1]).max().long().view(1)])
    low_src, high_src, low_dst, high_dst, repeated, longest = checks.tolist()
    if low_src < 0 or high_src >= num_src or low_dst < 0 or high_dst >= num_dst or repeated:
        return None
    col = torch.remainder(key, num_src).to(index_dtype)
    if edge_weight is None:
        values = torch.ones(num_edges, dtype=dtype or torch.float32, device=device)
    else:
        values = cast_values(edge_weight.index_select(0, order), dtype or edge_weight.dtype, "edge_weight")
    return CSR(rowptr, col, values, num_dst, num_src), longest


def check_options(window, symmetric, seed) -> tuple[int, bool | None, int]:
    """The options as plain Python values; numpy integers and bools are taken as theirs, anything
    else that merely compares equal (``16.0``, ``"yes"``) is refused."""
    if isinstance(window, np.integer):
        window = int(window)
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int, one of {WINDOWS}, got {window!r} ({type(window).__name__})")
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window}")
    if isinstance(symmetric, np.bool_):
        symmetric = bool(symmetric)
    if symmetric is not None and not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool or None, got {symmetric!r} ({type(symmetric).__name__})")
    if isinstance(seed, np.integer):
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return window, symmetric, seed


def choose_order(csr: CSR, reorder, symmetric: bool, window: int, seed: int):
    """The method actually used, its row permutation (None for the identity) and the
    permutation's ``rows_share_ratio`` where "auto" already computed it (else None). A numpy
    integer array is a permutation as a tensor is."""
    if isinstance(reorder, np.ndarray):
        if not np.issubdtype(reorder.dtype, np.integer):
            raise TypeError(f"a reorder permutation must hold integers, got a numpy array of dtype {reorder.dtype}")
        reorder = torch.from_numpy(np.ascontiguousarray(reorder, dtype=np.int64))
    if isinstance(reorder, torch.Tensor):
        return "user", checked_permutation(reorder, csr.num_rows, csr.col.device), None
    if reorder in (None, "none"):
        return "none", None, None
    if not isinstance(reorder, str):
        raise TypeError(
            f"reorder must be a method name or a permutation (tensor or numpy integer array), got {type(reorder).__name__}"
        )
    from . import reorder as reordering

    if reorder != "auto":
        perm = reordering.reorder(csr, reorder, symmetric=symmetric, window=window, seed=seed)
        return reorder, perm.to(csr.col.device), None
    method, perm, report = reordering.choose(csr, window=window, seed=seed, symmetric=symmetric)
    if method == "none":
        return "none", None, None
    return method, perm.to(csr.col.device), report["methods"][method]["rows_share_ratio"]


def checked_permutation(perm: torch.Tensor, size: int, device) -> torch.Tensor:
    if perm.is_floating_point() or perm.is_complex() or perm.dtype == torch.bool or perm.dim() != 1 or perm.numel() != size:
        raise ValueError(f"a row permutation must be an integer tensor of {size} entries, got {perm.dtype} {tuple(perm.shape)}")
    perm = perm.to(device=device, dtype=torch.long)
    seen = torch.zeros(size, dtype=torch.bool, device=device)
    if size and (int(perm.min()) < 0 or int(perm.max()) >= size):
        raise ValueError(f"row permutation holds an index outside [0, {size})")
    seen[perm] = True
    if not bool(seen.all()):
        raise ValueError("row permutation repeats an index: it is not a permutation")
    return perm
