"""``GINConv`` on a ``GraphPart``: each rank computes its rows of
``nn((1 + eps) x_i + sum_{j in N(i)} x_j)``."""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn._checks import check_features, check_flag
from ..tensor import TCSparseTensor
from .part import GraphPart
from .product import spmm


class DistributedGINConv(torch.nn.Module):
    """The graph isomorphism network's layer as PyG's ``GINConv`` computes it, on a part of an
    unnormalized adjacency (``GraphPart.from_rows``; the sum takes the entries' values as edge
    weights): ``out = nn((1 + eps) x_i + sum_j A[i, j] x_j)``. ``eps`` is trained where
    ``train_eps``; parameters and state-dict keys (``nn.*``, ``eps``) are PyG's.

    ``forward(x, part)`` takes this rank's rows of x (a ``TCSparseTensor`` part: the whole graph
    in one process, without torch.distributed)."""

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        if not isinstance(nn, torch.nn.Module):
            raise TypeError(f"nn must be a torch.nn.Module, got {type(nn).__name__}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"eps must be a float, got {type(eps).__name__}")
        self.nn = nn
        self.initial_eps = float(eps)
        if check_flag("train_eps", train_eps):
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.eps.data.fill_(self.initial_eps)

    def reset_parameters(self) -> None:
        for module in self.nn.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x: Tensor, part: GraphPart | TCSparseTensor) -> Tensor:
        check_features(x, "own rows")
        return self.nn(spmm(part, x) + (1 + self.eps) * x)

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}"
