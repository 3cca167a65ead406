"""Graph neural network layers on TCSparseTensor, drop-in for their PyG counterparts."""
from .gcn_conv import GCNConv, gcn_norm

__all__ = ["GCNConv", "gcn_norm"]
