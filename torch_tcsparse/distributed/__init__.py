"""Full-graph training across processes on torch.distributed (NCCL on GPUs, gloo on CPUs).

The rows of the graph matrix are partitioned (:func:`partition_rows`: METIS through pymetis, the
``[distributed]`` extra, or contiguous ranges); each rank holds its rows as a
:class:`GraphPart` built from its own rows only (:meth:`GraphPart.from_rows`, or :func:`gcn_part`
for the normalized adjacency): an interior block (own columns), a boundary block (halo columns)
and the lists of rows it sends to the other ranks. :func:`spmm` multiplies it with the rank's rows of X, exchanging
halo rows with ``all_to_all_single``, optionally while the interior block multiplies (``overlap``),
optionally in 16 bits (``halo_dtype``); :class:`DistributedGCNConv` is
``GCNConv`` on a part. Weights are replicated; wrap the model in ``DistributedDataParallel``.
"""
from .gcn_conv import DistributedGCNConv
from .layers import GlobalBatchNorm1d, node_dropout
from .normalization import gcn_part
from .part import GraphPart
from .partition import NodePartition, partition_rows
from .product import spmm

__all__ = [
    "DistributedGCNConv",
    "GlobalBatchNorm1d",
    "GraphPart",
    "NodePartition",
    "gcn_part",
    "node_dropout",
    "partition_rows",
    "spmm",
]
