"""Graph neural network layers on TCSparseTensor, drop-in for their PyG counterparts. PyG itself
(the optional ``[pyg]`` extra) is imported only when a graph is normalized."""
from .gcn_conv import GCNConv
from .normalization import gcn_norm
from .pyg_layers import fused

__all__ = ["GCNConv", "fused", "gcn_norm"]
