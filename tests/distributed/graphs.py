"""Small graphs with the shapes the distributed tests need, as CSR of ``A[target, source]``."""
import torch


def csr_of(row: torch.Tensor, col: torch.Tensor, num_nodes: int, values: torch.Tensor | None = None):
    order = torch.argsort(row * num_nodes + col)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(row, minlength=num_nodes), 0, out=rowptr[1:])
    return rowptr, col[order], None if values is None else values[order]


def with_isolated_nodes_and_closed_block(num_nodes: int, closed: int, seed: int, dtype=torch.float64):
    """Random entries, except that rows ``0..closed-1`` reference only columns ``0..closed-1``
    (a rank owning exactly them has no halo, though others read its rows), and that every
    fifth node has no entry at all (no row, no column); no entry repeats."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.randint(0, num_nodes, (6 * num_nodes,), generator=gen)
    col = torch.randint(0, num_nodes, (6 * num_nodes,), generator=gen)
    closed_rows = row < closed
    col = torch.where(closed_rows, col % closed, col)
    keep = (row % 5 != 4) & (col % 5 != 4)
    key = torch.unique(row[keep] * num_nodes + col[keep])
    row, col = key // num_nodes, key % num_nodes
    values = torch.rand(row.numel(), generator=gen, dtype=dtype) + 0.5
    return csr_of(row, col, num_nodes, values)


def dense(rowptr, col, values, num_cols: int) -> torch.Tensor:
    num_rows = rowptr.numel() - 1
    row = torch.repeat_interleave(torch.arange(num_rows), rowptr.diff())
    out = torch.zeros(num_rows, num_cols, dtype=values.dtype)
    return out.index_put_((row, col), values, accumulate=True)


def symmetric_sbm(num_nodes: int, seed: int):
    """Undirected graph of 4 dense communities, shuffled ids, without self-loops: (row, col)."""
    gen = torch.Generator().manual_seed(seed)
    block = torch.randperm(num_nodes, generator=gen) % 4
    row = torch.randint(0, num_nodes, (8 * num_nodes,), generator=gen)
    col = torch.randint(0, num_nodes, (8 * num_nodes,), generator=gen)
    keep = ((block[row] == block[col]) | (torch.rand(row.numel(), generator=gen) < 0.05)) & (row != col)
    row, col = row[keep], col[keep]
    key = torch.unique(torch.cat([row * num_nodes + col, col * num_nodes + row]))
    return key // num_nodes, key % num_nodes
