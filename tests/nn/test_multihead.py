"""The multi-head products' CUDA route checked on the CPU: its row pieces, its transposed CSR and
its autograd functions, run with a torch stand-in of the kernels' contract (``csrc/attention.h``,
piece by piece, slots and their merge included) against our SpMM per head and by gradcheck.
tests/gpu/test_attention.py holds the kernels themselves to the same contract."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn.attention_graph import attention_graph, build_kernel_operands, row_pieces
from torch_tcsparse.nn.multihead import KernelSpmm, edge_dots, per_head_products, weighted_sums


class PieceKernels:
    """``csrc/attention.h`` in torch ops: each piece sums its nonzeros; a piece with no slot
    writes its row, the others their slot, and each split row sums its slots in order. Rows and
    slots no piece writes stay NaN, as the kernel leaves them unwritten."""

    @staticmethod
    def spmm(weights, x, col, edge_ids, pieces, num_rows):
        begin = pieces.begin.long()
        count = pieces.row.numel()
        piece_of_edge = torch.repeat_interleave(torch.arange(count), begin[1:] - begin[:-1])
        ids = torch.arange(col.numel()) if edge_ids is None else edge_ids.long()
        products = weights[ids][begin[0]:][:, :, None] * x[col.long()][begin[0]:]
        sums = x.new_zeros(count, *x.shape[1:]).index_add(0, piece_of_edge, products)
        y = x.new_full((num_rows, *x.shape[1:]), float("nan"))
        partial = x.new_full((pieces.num_slots, *x.shape[1:]), float("nan"))
        direct = pieces.slot < 0
        y[pieces.row[direct].long()] = sums[direct]
        partial[pieces.slot[~direct].long()] = sums[~direct]
        for split, row in enumerate(pieces.split_rows.tolist()):
            y[row] = partial[pieces.split_begin[split]:pieces.split_begin[split + 1]].sum(0)
        return y

    @staticmethod
    def sddmm(a, b, row, col):
        return (a[row.long()] * b[col.long()]).sum(-1)


def graph(num_rows=30, num_cols=25, seed=0):
    """A rectangular adj_t with a hub row, empty rows and a hub column."""
    g = torch.Generator().manual_seed(seed)
    row = torch.cat([torch.randint(0, num_rows - 3, (150,), generator=g), torch.full((40,), 5)])
    col = torch.cat([torch.randint(0, num_cols, (150,), generator=g), torch.arange(40) % num_cols])
    row, col = torch.cat([row, torch.full((20,), 7)]), torch.cat([col, torch.full((20,), 3)])
    return TCSparseTensor.from_coo(row, col, torch.ones(row.numel(), dtype=torch.float64), (num_rows, num_cols))


def operands(adj, piece_nnz):
    csr = adj.csr
    return build_kernel_operands(csr.rowptr, csr.col, csr.row_indices(csr.col.dtype), csr.num_cols, piece_nnz)


@given(st.lists(st.integers(0, 40), max_size=30), st.integers(1, 9))
def test_pieces_cover_each_row_in_order(lengths, piece_nnz):
    rowptr = torch.tensor([0] + lengths).cumsum(0)
    pieces = row_pieces(rowptr, piece_nnz)
    begin, row, slot = pieces.begin.long(), pieces.row.long(), pieces.slot.long()
    assert begin[0] == 0 and begin[-1] == rowptr[-1] and bool((begin[1:] >= begin[:-1]).all())
    assert bool((begin[1:] - begin[:-1] <= piece_nnz).all())
    for r, length in enumerate(lengths):
        mine = (row == r).nonzero().squeeze(1)
        assert mine.numel() == max(1, -(-length // piece_nnz))
        assert begin[mine[0]] == rowptr[r] and begin[mine[-1] + 1] == rowptr[r + 1]
        assert bool((mine[1:] - mine[:-1] == 1).all())
    split = pieces.split_rows.long().tolist()
    assert split == [r for r, length in enumerate(lengths) if length > piece_nnz]
    for s, r in enumerate(split):
        slots = slot[row == r]
        assert slots.tolist() == list(range(int(pieces.split_begin[s]), int(pieces.split_begin[s + 1])))
    assert bool((slot[~torch.isin(row, torch.tensor(split, dtype=torch.long))] == -1).all())
    assert pieces.num_slots == int((slot >= 0).sum())


def test_transposed_csr_is_the_transpose():
    adj = graph()
    o = operands(adj, 4)
    transposed = adj.t().csr
    assert torch.equal(o.col_t.long(), transposed.col.long())
    csr = adj.csr
    assert torch.equal(csr.col.long()[o.edge_ids_t.long()], transposed.row_indices())
    assert torch.equal(o.row.long()[o.edge_ids_t.long()], o.col_t.long())


@pytest.mark.parametrize("piece_nnz", [1, 3, 256])
@pytest.mark.parametrize("heads", [1, 3])
def test_kernel_route_equals_our_spmm_per_head(piece_nnz, heads):
    adj = graph()
    o = operands(adj, piece_nnz)
    weights = torch.randn(adj.nnz, heads, dtype=torch.float64, requires_grad=True)
    x = torch.randn(adj.shape[1], heads, 5, dtype=torch.float64, requires_grad=True)
    got = KernelSpmm.apply(weights, x, o, PieceKernels)
    expected = per_head_products(adj, weights, x)
    torch.testing.assert_close(got, expected)
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, (weights, x), g), torch.autograd.grad(expected, (weights, x), g))
    torch.testing.assert_close(PieceKernels.spmm(weights, x, o.col, None, o.pieces, o.num_rows), expected)


def test_kernel_route_gradients():
    adj = graph(12, 9, seed=1)
    o = operands(adj, 2)
    weights = torch.randn(adj.nnz, 2, dtype=torch.float64, requires_grad=True)
    x = torch.randn(9, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, f: KernelSpmm.apply(w, f, o, PieceKernels), (weights, x))


def test_torch_dots_and_the_weighted_sums_without_autograd():
    adj = graph(12, 9, seed=2)
    attention = attention_graph(adj, self_loops=False)
    a = torch.randn(12, 3, 4, dtype=torch.float64)
    b = torch.randn(9, 3, 4, dtype=torch.float64)
    csr = adj.csr
    expected = (a[csr.row_indices()] * b[csr.col.long()]).sum(-1)
    torch.testing.assert_close(edge_dots(a, b, attention.row, attention.col), expected)
    weights = torch.randn(adj.nnz, 3, dtype=torch.float64)
    torch.testing.assert_close(weighted_sums(attention, weights, b), per_head_products(adj, weights, b))
    torch.testing.assert_close(weighted_sums(attention, weights, a, transposed=True),
                               per_head_products(adj, weights, a, transposed=True))


def pattern(matrix):
    csr = matrix.csr
    return set(zip(csr.row_indices().tolist(), csr.col.tolist()))


def test_self_loops_complete_the_diagonal_of_a_rectangular_matrix():
    adj = graph()
    loops = attention_graph(adj, self_loops=True).matrix
    assert pattern(loops) == pattern(adj) | {(i, i) for i in range(min(adj.shape))}
