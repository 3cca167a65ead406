"""Graph neural network layers on TCSparseTensor: a drop-in GCNConv, and ``fused(Layer)``, PyG's own
layers on our kernels. PyG itself (the optional ``[pyg]`` extra) is imported only where PyG's own
functions serve: normalizing an edge_index or a torch sparse matrix, a layer's route for inputs
other than a TCSparseTensor, attention weights returned as PyG returns them."""
from .gcn_conv import GCNConv
from .normalization import gcn_norm
from .pyg_layers import fused

__all__ = ["GCNConv", "fused", "gcn_norm"]
