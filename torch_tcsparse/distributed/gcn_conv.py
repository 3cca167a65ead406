"""``GCNConv`` on a ``GraphPart``: each rank computes its rows of ``Â (x W) + b``."""
from __future__ import annotations

from torch import Tensor

from ..nn import GCNConv
from ..nn._checks import check_features
from ..tensor import TCSparseTensor
from .part import GraphPart
from .product import spmm


class DistributedGCNConv(GCNConv):
    """``out = Â (x W) + b`` for this rank's rows, ``Â`` being the part's matrix, normalized
    when the part was built (:func:`gcn_part`). Parameters, their initialization and state-dict
    keys are ``GCNConv``'s, so weights load either way and the same seed gives the same weights.

    ``forward(x, part)`` takes this rank's rows of x (a ``TCSparseTensor`` part: the whole
    graph in one process, without torch.distributed). The halo exchange sends the narrower of
    the layer's sides: with ``in_channels < out_channels`` it computes ``(Â x) W``, equal to
    ``Â (x W)`` up to rounding.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__(in_channels, out_channels, normalize=False, bias=bias)

    def forward(self, x: Tensor, part: GraphPart | TCSparseTensor) -> Tensor:
        check_features(x, "own rows", self.in_channels)
        if self.in_channels < self.out_channels:
            out = self.lin(spmm(part, x))
        else:
            out = spmm(part, self.lin(x))
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"
