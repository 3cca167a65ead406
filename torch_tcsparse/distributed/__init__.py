"""Full-graph training across processes on torch.distributed (NCCL on GPUs, gloo on CPUs).

The rows of the graph matrix are partitioned (:func:`partition_rows`: this package's multilevel
partitioner, METIS through pymetis, or contiguous ranges); a graph no process holds whole is
partitioned from the blocks of rows each rank reads (:func:`partition_blocks`), and
:class:`Placement` moves rows, features and labels to the rank of their part. Each rank holds
its rows as a :class:`GraphPart` built from its own rows only (:meth:`GraphPart.from_rows`, or
:func:`gcn_part` for the normalized adjacency): an interior block (own columns), a boundary
block (halo columns) and the lists of rows it sends to the other ranks. :func:`spmm` multiplies
it with the rank's rows of X (sum, mean, max or min), exchanging halo rows with
``all_to_all_single``, optionally while the interior block multiplies (``overlap``), optionally
in 16 bits (``halo_dtype``). :class:`DistributedGCNConv`, :class:`DistributedSAGEConv` and
:class:`DistributedGINConv` are PyG's layers on a part. Weights are replicated; wrap the model
in ``DistributedDataParallel``. :class:`EmulatedPeers` builds and runs one rank's part alone,
to measure it on one device.
"""
from .exchange import EmulatedPeers
from .gcn_conv import DistributedGCNConv
from .gin_conv import DistributedGINConv
from .layers import GlobalBatchNorm1d, node_dropout
from .normalization import gcn_part
from .part import GraphPart
from .partition import NodePartition, partition_rows
from .placement import Placement, block_bounds, partition_blocks
from .product import spmm
from .sage_conv import DistributedSAGEConv

__all__ = [
    "DistributedGCNConv",
    "DistributedGINConv",
    "DistributedSAGEConv",
    "EmulatedPeers",
    "GlobalBatchNorm1d",
    "GraphPart",
    "NodePartition",
    "Placement",
    "block_bounds",
    "gcn_part",
    "node_dropout",
    "partition_blocks",
    "partition_rows",
    "spmm",
]
