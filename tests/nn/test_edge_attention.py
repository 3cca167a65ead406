"""Attention weights from per-node arrays (``nn.edge_attention``) checked on the CPU: the torch
route's autograd functions by gradcheck (GAT with and without target scores, dot products), and
the plan of ``csrc/edge_softmax.cu`` (rows in pieces of at most 64 edges, an online (max, sum) per
piece, a split row's slots merged in order, then each piece's second pass) run in torch ops
against the torch route on hub rows, rows of exactly one piece and empty rows.
tests/gpu/test_edge_attention.py holds the kernels to the torch route."""
import math

import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn.attention_graph import SOFTMAX_PIECE_EDGES, AttentionGraph, row_pieces
from torch_tcsparse.nn.edge_attention import DotAttention, GatAttention, TorchRoute, gat_attention


def graph(num_rows=30, num_cols=400, seed=0):
    """Empty rows, a row of exactly 64 edges, one of 65 and a hub of 300."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, num_rows - 4, (150,), generator=g)]
    cols = [torch.randint(0, num_cols, (150,), generator=g)]
    for r, n in ((num_rows - 3, 64), (num_rows - 2, 65), (5, 300)):
        rows.append(torch.full((n,), r))
        cols.append(torch.arange(n) % num_cols)
    row, col = torch.cat(rows), torch.cat(cols)
    return AttentionGraph(TCSparseTensor.from_coo(row, col, torch.ones(row.numel(), dtype=torch.float64),
                                                  (num_rows, num_cols)))


def test_gradients_of_the_torch_route():
    g = graph(12, 9)  # duplicates summed: rows of at most 9 edges
    route = TorchRoute(g)
    src = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    dst = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, d: GatAttention.apply(s, d, route, 0.2), (src, dst))
    assert torch.autograd.gradcheck(lambda s: GatAttention.apply(s, None, route, 0.1), (src,))
    query = torch.randn(12, 2, 4, dtype=torch.float64, requires_grad=True)
    key = torch.randn(9, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: DotAttention.apply(q, k, route, 0.5), (query, key))


def test_gat_route_equals_the_formula():
    g = graph()
    src, dst = torch.randn(400, 2, dtype=torch.float64), torch.randn(30, 2, dtype=torch.float64)
    scores = torch.nn.functional.leaky_relu(src[g.col.long()] + dst[g.row.long()], 0.2)
    row = g.row.long()
    exp = (scores - torch.full((30, 2), -math.inf, dtype=torch.float64).index_reduce(0, row, scores, "amax")[row]).exp()
    expected = exp / (torch.zeros(30, 2, dtype=torch.float64).index_add(0, row, exp)[row] + 1e-16)
    torch.testing.assert_close(gat_attention(g, src, dst, 0.2), expected)


def piece_softmax(scores, pieces):
    """csrc/edge_softmax.cu's forward in torch ops, on scores [E, heads] already formed."""
    begin = pieces.begin.long()
    alpha = torch.full_like(scores, float("nan"))
    heads = scores.shape[1]
    stats = {}
    for p in range(pieces.row.numel()):
        m, s = torch.full((heads,), -math.inf, dtype=scores.dtype), torch.zeros(heads, dtype=scores.dtype)
        for e in scores[begin[p]:begin[p + 1]]:
            larger = e > m
            s = torch.where(larger, s * torch.exp(m - e) + 1, s + torch.exp(e - m))
            m = torch.where(larger, e, m)
        stats[p] = (m, s)
    for split, row in enumerate(pieces.split_rows.tolist()):
        mine = [p for p in range(pieces.row.numel()) if int(pieces.row[p]) == row]
        assert [int(pieces.slot[p]) for p in mine] == list(range(int(pieces.split_begin[split]),
                                                                 int(pieces.split_begin[split + 1])))
        m, s = torch.full((heads,), -math.inf, dtype=scores.dtype), torch.zeros(heads, dtype=scores.dtype)
        for p in mine:
            pm, ps = stats[p]
            larger = pm > m
            s = torch.where(larger, s * torch.exp(m - pm) + ps, s + ps * torch.exp(pm - m))
            m = torch.where(larger, pm, m)
        stats.update({p: (m, s) for p in mine})
    for p, (m, s) in stats.items():
        alpha[begin[p]:begin[p + 1]] = torch.exp(scores[begin[p]:begin[p + 1]] - m) / (s + 1e-16)
    return alpha


def piece_softmax_backward(alpha, grad, pieces):
    """csrc/edge_softmax.cu's backward in torch ops, up to the scores' slope."""
    begin = pieces.begin.long()
    weighted = {p: (alpha[begin[p]:begin[p + 1]] * grad[begin[p]:begin[p + 1]]).sum(0)
                for p in range(pieces.row.numel())}
    for row in pieces.split_rows.tolist():
        mine = [p for p in range(pieces.row.numel()) if int(pieces.row[p]) == row]
        total = sum(weighted[p] for p in mine)
        weighted.update({p: total for p in mine})
    out = torch.full_like(alpha, float("nan"))
    for p, w in weighted.items():
        out[begin[p]:begin[p + 1]] = alpha[begin[p]:begin[p + 1]] * (grad[begin[p]:begin[p + 1]] - w)
    return out


@pytest.mark.parametrize("heads", [1, 3])
def test_the_kernel_plan_equals_the_torch_route(heads):
    g = graph()
    pieces = row_pieces(g.matrix.csr.rowptr, SOFTMAX_PIECE_EDGES)
    assert pieces.num_slots > 0 and int((pieces.begin[1:] - pieces.begin[:-1]).max()) <= SOFTMAX_PIECE_EDGES
    route = TorchRoute(g)
    src, dst = 3 * torch.randn(400, heads, dtype=torch.float64), 3 * torch.randn(30, heads, dtype=torch.float64)
    alpha = route.gat(src, dst, 0.2)
    scores = torch.nn.functional.leaky_relu(src[g.col.long()] + dst[g.row.long()], 0.2)
    torch.testing.assert_close(piece_softmax(scores, pieces), alpha)
    grad = torch.randn_like(alpha)
    expected, _ = route.gat_backward(alpha, grad, src, dst, 0.2, False)
    slope = torch.where(src[g.col.long()] + dst[g.row.long()] > 0, 1.0, 0.2).double()
    torch.testing.assert_close(piece_softmax_backward(alpha, grad, pieces) * slope, expected)
