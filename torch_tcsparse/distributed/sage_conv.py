"""``SAGEConv`` on a ``GraphPart``: each rank computes its rows of
``W_l aggr_{j in N(i)} x_j + b + W_r x_i``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn._checks import check_channels, check_features, check_flag
from ..paths import REDUCTION_ALIASES, REDUCTIONS
from ..tensor import TCSparseTensor
from .part import GraphPart
from .product import spmm


class DistributedSAGEConv(torch.nn.Module):
    """GraphSAGE's layer as PyG's ``SAGEConv`` computes it, on a part of an unnormalized
    adjacency (``GraphPart.from_rows``): ``out = lin_l(aggr(x_j)) + lin_r(x_i)``, ``aggr`` one of
    "mean", "sum", "max", "min" over the row's entries (``A[i, j] * x_j``; an isolated node
    aggregates 0), L2-normalized where ``normalize``. Parameters and state-dict keys
    (``lin_l.weight``, ``lin_l.bias``, ``lin_r.weight``) are PyG's, so weights load either way.

    ``forward(x, part)`` takes this rank's rows of x (a ``TCSparseTensor`` part: the whole graph
    in one process, without torch.distributed). For "sum" and "mean", linear in x, the exchange
    sends the narrower side: with ``out_channels < in_channels`` it aggregates ``x W_l^T``.
    """

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "mean", normalize: bool = False,
                 root_weight: bool = True, bias: bool = True):
        super().__init__()
        self.in_channels = check_channels("in_channels", in_channels)
        self.out_channels = check_channels("out_channels", out_channels)
        if not isinstance(aggr, str) or REDUCTION_ALIASES.get(aggr, aggr) not in REDUCTIONS:
            raise ValueError(f"aggr must be one of {REDUCTIONS}, got {aggr!r}")
        self.aggr = REDUCTION_ALIASES.get(aggr, aggr)
        self.normalize = check_flag("normalize", normalize)
        self.root_weight = check_flag("root_weight", root_weight)
        self.lin_l = torch.nn.Linear(in_channels, out_channels, bias=check_flag("bias", bias))
        if self.root_weight:
            self.lin_r = torch.nn.Linear(in_channels, out_channels, bias=False)

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def forward(self, x: Tensor, part: GraphPart | TCSparseTensor) -> Tensor:
        check_features(x, "own rows", self.in_channels)
        if self.aggr in ("sum", "mean") and self.out_channels < self.in_channels:
            out = spmm(part, F.linear(x, self.lin_l.weight), self.aggr)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(spmm(part, x, self.aggr))
        if self.root_weight:
            out = out + self.lin_r(x)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr!r}"
