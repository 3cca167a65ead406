"""Full-graph GCN training across GPUs: epoch time and memory per GPU on one GPU and on all of
torchrun's, per graph; each rank of P emulated alone on one GPU; the model for P = 2 to 256.

    torchrun --nproc-per-node 2 -m benchmarks.distributed --scales 22,24 --configs plain,overlap
    python -m benchmarks.distributed --emulate 2,4 --scales 24       # one GPU: each rank of P = 2 and 4 alone
    python -m benchmarks.distributed --predict out/distributed.csv --link-gbps 150   # P = 2 to 256
    torchrun --nproc-per-node 2 -m benchmarks.distributed --device cpu --scales 12 --epochs 2   # gloo smoke run

Per R-MAT scale (graph_data-style R-MAT, generated a block of rows at a time: benchmarks.distributed.graph),
cheapest first, each line printed as it is measured: the model is examples.gcn.train_distributed's
GCN (``--layers`` 2, ``--hidden`` 256, float32 with TF32 allowed), features and labels hashed from
the node ids, the loss over every node.

One GPU (rank 0 under torchrun, the process otherwise) first trains on the whole graph, unless
the one-GPU bytes per nonzero and per row of a smaller scale say it cannot fit (recorded as such,
with the estimate; out of memory is recorded too). Rows are weighed in the partition by their
nonzeros plus a row weight per balanced constraint (``--row-weight``, default: the one-GPU run's
time per row over its time per nonzero, and its training bytes per row over its graph bytes per
nonzero: time and memory are both balanced; ``--rebalance`` partitions a second time with the
time weight fitted to the first partition's ranks: ``rebalance``).

Under torchrun, every rank generates its block of rows (a range of node ids) and coarsens it;
rank 0 partitions the graph of the ranks' clusters on its GPU (``--gather whole``: every block's
structure, 4 bytes per nonzero and 8 per node); every rank receives its rows (Placement), builds its
part and trains under every exchange of ``--configs`` (``plain``: exchange, then multiply;
``overlap``: the interior product during the exchange; ``-bf16``: halo rows in bfloat16).
Reported per graph, GPU count and exchange: the median epoch (forward, backward, DDP's gradient
reduction, Adam step), its split into exchange (CUDA events around the halo exchanges outside the
products, in separate instrumented epochs) and compute, the halo bytes against the cut nonzeros
times the row bytes, the time and peak memory of generating, partitioning and building, the
peak memory per GPU while training, and the loss of every epoch (the mean over every node; P
ranks give the one-GPU run's curve).

``--emulate`` (one process, one GPU) builds and trains each rank of every P listed alone, its
halo exchange replaced by copies of its own rows (``EmulatedPeers``): the peak memory and compute
time of each rank of a P-GPU run, with the model's figures and the target (1.2 times the one-GPU
peak over P, plus the rank's halo buffers), into distributed_emulated.csv.

Under torchrun, rank 0 prints a line as every rank finishes each stage (generating, partitioning,
placing, the part's exchange plan, blocks, transposes and normalization, the link measurement,
the first epoch's forward and backward passes, every timed epoch), with the time and every
rank's allocated and peak GPU memory; a rank that fails prints its error and exits at once, so
that torchrun stops the others instead of their waiting in a collective (``progress``).

Writes distributed.csv into --out (default $OUT, else ./out); ``--predict`` reads it (and the
emulated ranks beside it) and writes distributed_model.csv and the markdown table
distributed_model.md.
"""
from .cli import main, measure, parse_args

__all__ = ["main", "measure", "parse_args"]
