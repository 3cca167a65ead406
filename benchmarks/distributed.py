"""Full-graph GCN training across GPUs: epoch time on one GPU and on all of torchrun's, per graph.

    torchrun --nproc-per-node 2 -m benchmarks.distributed                      # R-MAT 22 and 25
    torchrun --nproc-per-node 2 -m benchmarks.distributed --scales 22 --configs plain,overlap
    torchrun --nproc-per-node 2 -m benchmarks.distributed --device cpu --scales 12 --epochs 2   # gloo smoke run
    python -m benchmarks.distributed --predict out/distributed.csv --parts 2,4,8,16,32,64,128,256

Per R-MAT scale (graph_data.synthetic.rmat, generated on each rank with the same seed; a rank
keeps its rows of it), cheapest first, each line printed as it is measured: the model is
examples.gcn.train_distributed's GCN (``--layers`` 2, ``--hidden`` 256, float32 with TF32
allowed) on random features and labels, the loss over every node. Rank 0 first trains on the
whole graph alone (the one-GPU epoch), unless the one-GPU bytes per row and per nonzero of a
smaller scale say it cannot fit (recorded as such, with the estimate; out of memory is recorded
too). Then the ranks partition the graph (rows weighed by their nonzeros plus ``--row-weight``,
by default the one-GPU run's time per row over its time per nonzero), report every rank's rows,
nonzeros and halo, build their parts once, and train under every exchange of ``--configs``
(``plain``: exchange, then multiply; ``overlap``: the interior product during the exchange;
``-bf16``: halo rows in bfloat16). Reported per graph, GPU count and exchange: the median epoch
(forward, backward, DDP's gradient reduction, Adam step), its split into exchange (the time a
rank spends in the halo exchanges outside the products, timed with CUDA events in separate
instrumented epochs: waits for the slower rank included, with overlap only what the interior
product did not hide) and compute (the rest), the halo bytes sent per epoch against the
partition's cut nonzeros times the bytes of the rows exchanged, the build time, and the peak
memory per GPU (building and training). Writes distributed.csv into --out (default $OUT, else
./out) and METIS partitions into its partitions/ folder, where --predict finds them;
``torch_tcsparse.distributed.model`` reads the CSV.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from benchmarks.common import out_dir, write_csv
from examples.gcn.train_distributed import DistributedGCN, dropout_seed
from graph_data import synthetic
from torch_tcsparse.distributed import NodePartition, gcn_part, partition_rows
from torch_tcsparse.distributed.model import Measured, part_shape, predict, product_widths
from torch_tcsparse.distributed.partition import METHODS

# Exchange configurations: (overlap, halo dtype).
CONFIGS = {"plain": (False, None), "overlap": (True, None), "plain-bf16": (False, torch.bfloat16),
           "overlap-bf16": (True, torch.bfloat16)}

FIELDS = ["graph", "nodes", "nnz", "gpus", "device", "partitioner", "row_weight", "config", "overlap", "halo_bits",
          "status", "epoch_ms", "compute_ms", "exchange_ms", "halo_rows", "cut_nonzeros", "exchanged_width",
          "halo_bytes_per_epoch", "cut_x_feature_bytes", "rows_per_rank", "nnz_per_rank", "halo_per_rank",
          "build_s", "sparse_ms", "graph_gb", "link_gbps", "single_gb_needed", "build_peak_gb_per_rank",
          "peak_gb_per_rank", "peak_gb", "features", "hidden", "classes", "layers"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="22,25", help="comma list of R-MAT scales, measured in this order")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--partitioner", choices=METHODS, default="auto",
                        help="auto: METIS (pymetis) up to --metis-max-nodes, contiguous ranges above; with --predict, "
                             "auto takes the measured run's METIS partition from partitions/ where saved, else "
                             "contiguous ranges (seconds for any P), and metis runs (and saves) METIS for every P")
    parser.add_argument("--metis-max-nodes", type=int, default=1 << 23,
                        help="METIS runs on one CPU core of rank 0: larger graphs take contiguous ranges under auto")
    parser.add_argument("--row-weight", type=int, default=None,
                        help="a row's weight beside its nonzeros when partitioning (default: the one-GPU run's time "
                             "per row over its time per nonzero, kept for later scales; 0 before any)")
    parser.add_argument("--configs", default="plain,overlap,overlap-bf16,plain-bf16",
                        help=f"comma list of exchanges to time on the parts, of {list(CONFIGS)}")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs, after 2 of warm-up")
    parser.add_argument("--no-single", action="store_true", help="skip the one-GPU run on rank 0")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for a smoke run")
    parser.add_argument("--generate", choices=("device", "cpu"), default="device",
                        help="where each rank generates the whole graph before keeping its rows: generating R-MAT 25 "
                             "on a GPU peaks at tens of GB; cpu takes longer and host memory per rank")
    parser.add_argument("--link-mb", type=int, default=256, help="MB per rank of the all-to-all that times the link")
    parser.add_argument("--out", default=None)
    parser.add_argument("--predict", default=None, help="a distributed.csv to model (no torchrun)")
    parser.add_argument("--parts", default="2,4,8,16,32,64,128,256", help="with --predict: the GPU counts")
    parser.add_argument("--gpus-per-node", type=int, default=8,
                        help="with --predict: beyond this many GPUs the halo crosses the network")
    parser.add_argument("--network-gbps", type=float, default=25.0,
                        help="with --predict: bytes per second (GB/s) a GPU sends over the network")
    args = parser.parse_args(argv)
    args.scales = [int(s) for s in args.scales.split(",")]
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs takes {list(CONFIGS)}, got {unknown}")
    for name in ("features", "hidden", "classes", "layers", "epochs", "edge_factor"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.row_weight is not None and args.row_weight < 0:
        raise SystemExit(f"--row-weight must be at least 0, got {args.row_weight}")
    return args


class Clock:
    """Wall time of host-side sections; on a GPU, the device time between CUDA events."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pairs, self.host = [], 0.0

    def wrap(self, fn):
        def timed(*args):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = fn(*args)
                end.record()
                self.pairs.append((start, end))
                return result
            start = time.perf_counter()
            result = fn(*args)
            self.host += time.perf_counter() - start
            return result
        return timed

    def seconds(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.host + sum(start.elapsed_time(end) for start, end in self.pairs) / 1e3


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def generator_device(args, device: torch.device) -> torch.device:
    return device if args.generate == "device" else torch.device("cpu")


def graph_csr(scale: int, edge_factor: int, device):
    """The R-MAT graph's CSR (symmetric, no self-loops), the same on every rank."""
    row, col, num_nodes = synthetic.rmat(scale, edge_factor=edge_factor, seed=1, device=device)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(row, minlength=num_nodes), 0, out=rowptr[1:])
    del row
    return rowptr, col, num_nodes


def epochs(step_model, x, y, part, nodes, args, device):
    """Seconds of each of 2 + ``args.epochs`` epochs, the first 2 being warm-up."""
    optimizer = torch.optim.Adam(step_model.parameters(), lr=0.01)
    times = []
    for epoch in range(2 + args.epochs):
        synchronize(device)
        start = time.perf_counter()
        step_model.train()
        optimizer.zero_grad()
        out = step_model(x, part, nodes, dropout_seed(0, epoch))
        # DDP averages gradients over the ranks: each rank's sum is scaled to the global mean times P.
        loss = F.cross_entropy(out, y, reduction="sum") * (args.world / args.num_nodes)
        loss.backward()
        optimizer.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def own_features(args, num_rows: int, seed: int, device):
    """Random features and labels for ``num_rows`` rows, drawn on the device from ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x = torch.randn(num_rows, args.features, generator=gen, device=device)
    y = torch.randint(0, args.classes, (num_rows,), generator=gen, device=device)
    return x, y


def single_gb_needed(args) -> float | None:
    """The one-GPU peak of this scale by the last one-GPU run's bytes per nonzero (the graph)
    and per row (the rest), its nonzeros scaled with the drawn edges; None before any."""
    reference = args.reference
    if reference is None:
        return None
    growth = (args.num_nodes / reference["nodes"]) * (args.edge_factor / reference["edge_factor"])
    graph = reference["graph_gb"] * growth
    rest = (reference["peak_gb"] - reference["graph_gb"]) * args.num_nodes / reference["nodes"]
    return graph + rest


def single_gpu(args, device, group_of_one) -> dict:
    """Rank 0 trains on the whole graph (the part of a one-rank group is the whole matrix)."""
    needed = single_gb_needed(args)
    if device.type == "cuda" and needed is not None:
        capacity = torch.cuda.get_device_properties(device).total_memory / 2**30
        if needed > capacity:
            return {"status": f"does not fit one GPU ({needed:.0f} GB needed, {capacity:.0f} GB)",
                    "single_gb_needed": needed, "peak_gb": float("nan")}
    reset_peak(device)
    start = time.perf_counter()
    args.world = 1
    try:
        rowptr, col, num_nodes = graph_csr(args.scale, args.edge_factor, generator_device(args, device))
        matrix = gcn_part(rowptr.to(device), col.to(device), None, (0, num_nodes), group=group_of_one).interior
        del rowptr, col
        synchronize(device)
        build_s, build_peak = time.perf_counter() - start, peak_gb(device)
        graph_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else float("nan")
        sparse_s = products_time(matrix, args, device)
        reset_peak(device)
        x, y = own_features(args, num_nodes, 0, device)
        torch.manual_seed(0)
        model = make_model(args, device)
        epoch_s = statistics.median(epochs(model, x, y, matrix, torch.arange(num_nodes, device=device), args, device)[2:])
    except torch.cuda.OutOfMemoryError:
        return {"status": "out of memory", "single_gb_needed": needed, "peak_gb_per_rank": f"{peak_gb(device):.2f}",
                "peak_gb": peak_gb(device)}
    finally:
        args.world = dist.get_world_size()
    row = {"status": "ok", "epoch_ms": 1000 * epoch_s, "compute_ms": 1000 * epoch_s, "exchange_ms": 0.0,
           "halo_rows": 0, "cut_nonzeros": 0, "halo_bytes_per_epoch": 0, "cut_x_feature_bytes": 0,
           "rows_per_rank": str(num_nodes), "nnz_per_rank": str(matrix.nnz), "halo_per_rank": "0",
           "nnz": matrix.nnz, "build_s": build_s, "sparse_ms": 1000 * sparse_s, "graph_gb": graph_bytes / 2**30,
           "build_peak_gb_per_rank": f"{build_peak:.2f}", "peak_gb_per_rank": f"{peak_gb(device):.2f}",
           "peak_gb": peak_gb(device)}
    if device.type == "cuda":
        args.reference = {"nodes": num_nodes, "edge_factor": args.edge_factor, "graph_gb": row["graph_gb"],
                          "peak_gb": row["peak_gb"]}
    return row


def measured_row_weight(row: dict) -> int:
    """A row's cost in nonzeros on one GPU: the time per row of what is not the sparse products
    over the products' time per nonzero."""
    sparse_s, epoch_s = row["sparse_ms"] / 1e3, row["epoch_ms"] / 1e3
    per_row = max(epoch_s - sparse_s, 0.0) / row["nodes"]
    per_nonzero = sparse_s / row["nnz"]
    return round(per_row / per_nonzero) if per_nonzero > 0 else 0


def products_time(matrix, args, device) -> float:
    """Seconds of the sparse products of one epoch on the whole graph (A is symmetric: the
    backward products multiply by its transpose, built and kept like a part's)."""
    transpose = matrix.t()
    total = 0.0
    for width, backward in product_widths(args.features, args.hidden, args.classes, args.layers):
        dense = torch.randn(matrix.shape[1], width, device=device)
        for operand in (matrix, transpose) if backward else (matrix,):
            operand @ dense
            synchronize(device)
            start = time.perf_counter()
            for _ in range(5):
                operand @ dense
            synchronize(device)
            total += (time.perf_counter() - start) / 5
    return total


def link_bandwidth(device, nbytes: int) -> float:
    """Bytes per second one rank sends in an all_to_all_single of about ``nbytes`` per rank."""
    world = dist.get_world_size()
    send = torch.ones(max(1, nbytes // 4 // world) * world, device=device)
    nbytes = send.numel() * 4
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(5):
        dist.all_to_all_single(receive, send)
    synchronize(device)
    # Of each rank's buffer, the share addressed to itself does not cross a link.
    return 5 * nbytes * (world - 1) / world / (time.perf_counter() - start)


def make_model(args, device):
    return DistributedGCN(args.features, args.hidden, args.classes, args.layers, args.dropout).to(device)


def choose_partitioner(args, num_nodes: int) -> str:
    if args.partitioner == "auto" and num_nodes > args.metis_max_nodes:
        return "contiguous"
    return args.partitioner


def partition_file(out: Path, graph: str, edge_factor: int, parts: int, row_weight: int) -> Path:
    return out / "partitions" / f"{graph}-ef{edge_factor}-p{parts}-w{row_weight}-metis.pt"


def save_partition(partition: NodePartition, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"order": partition.order, "bounds": partition.bounds}, path)


def load_partition(path: Path) -> NodePartition:
    saved = torch.load(path)
    return NodePartition(saved["order"], tuple(saved["bounds"]), "metis")


def shared_partition(rowptr, col, num_nodes, args) -> NodePartition:
    box = [None]
    if dist.get_rank() == 0:
        partition = partition_rows(rowptr.cpu(), col.cpu(), dist.get_world_size(), choose_partitioner(args, num_nodes),
                                   row_weight=args.current_row_weight)
        if partition.method == "metis":
            save_partition(partition, partition_file(out_dir(args.out), f"rmat{args.scale}", args.edge_factor,
                                                     partition.num_parts, args.current_row_weight))
        box[0] = partition
    dist.broadcast_object_list(box, src=0)
    return box[0]


class ExchangeMeter:
    """Wraps a part's halo exchanges: the time the rank spends in them outside the products
    (starting each, then waiting for its rows: with overlap, only the wait the interior product
    did not hide), and the width of every exchanged block."""

    def __init__(self, part, device):
        self.clock, self.widths = Clock(device), []
        self.part = part
        part.gather_halo = self._metered(part.gather_halo)
        part.scatter_halo = self._metered(part.scatter_halo)

    def detach(self) -> None:
        """Gives the part its own methods back."""
        del self.part.gather_halo, self.part.scatter_halo

    def _metered(self, fn):
        start = self.clock.wrap(fn)

        def metered(tensor, *rest):
            self.widths.append(tensor.size(1))
            pending = start(tensor, *rest)
            pending.wait = self.clock.wrap(pending.wait)
            return pending
        return metered


def build_parts(args, device) -> dict:
    """Partitions the graph, builds this rank's part, and gathers every rank's shape."""
    rank = dist.get_rank()
    reset_peak(device)
    start = time.perf_counter()
    rowptr, col, num_nodes = graph_csr(args.scale, args.edge_factor, generator_device(args, device))
    partition = shared_partition(rowptr, col, num_nodes, args)
    own_rowptr, own_col, _ = partition.rows(rowptr, col, None, rank)
    del rowptr, col
    if device.type == "cuda":
        torch.cuda.empty_cache()
    own_rowptr, own_col = own_rowptr.to(device), own_col.to(device)
    first, end = partition.bounds[rank], partition.bounds[rank + 1]
    cut = int(((own_col < first) | (own_col >= end)).sum())
    part = gcn_part(own_rowptr, own_col, None, partition.bounds)
    del own_rowptr, own_col
    synchronize(device)
    build_s, build_peak = time.perf_counter() - start, peak_gb(device)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, dict(rows=part.num_own, halo=part.num_halo, nnz=part.nnz, cut=cut,
                                          build_peak=build_peak))
    return {"partition": partition, "part": part, "build_s": build_s, "ranks": gathered}


def train_config(args, device, built: dict, config: str) -> dict:
    """Trains on this rank's part under one exchange; the row of the measurement."""
    rank, world = dist.get_rank(), dist.get_world_size()
    overlap, halo_dtype = CONFIGS[config]
    part = built["part"].exchanging(overlap, halo_dtype)
    reset_peak(device)
    nodes = built["partition"].nodes(rank).to(device)
    x, y = own_features(args, part.num_own, rank, device)
    torch.manual_seed(0)
    model = make_model(args, device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    args.world = world
    epoch_s = statistics.median(epochs(ddp, x, y, part, nodes, args, device)[2:])
    train_peak = peak_gb(device)

    # Exchange and compute: means over the instrumented epochs, warm-up included on both sides.
    meter = ExchangeMeter(part, device)
    instrumented_s = statistics.mean(epochs(ddp, x, y, part, nodes, args, device))
    meter.detach()
    exchange_s = meter.clock.seconds() / (2 + args.epochs)
    width = sum(meter.widths) // (2 + args.epochs)
    gathered = [None] * world
    dist.all_gather_object(gathered, dict(exchange_s=exchange_s, peak=train_peak))
    ranks = built["ranks"]
    halo_rows, cut = sum(r["halo"] for r in ranks), sum(r["cut"] for r in ranks)
    exchange_s = max(g["exchange_s"] for g in gathered)
    element = x.element_size() if halo_dtype is None else halo_dtype.itemsize
    return {"status": "ok", "partitioner": built["partition"].method, "row_weight": args.current_row_weight,
            "config": config, "overlap": int(overlap), "halo_bits": 8 * element, "epoch_ms": 1000 * epoch_s,
            "exchange_ms": 1000 * exchange_s, "compute_ms": 1000 * (instrumented_s - exchange_s),
            "halo_rows": halo_rows, "cut_nonzeros": cut, "exchanged_width": width,
            "halo_bytes_per_epoch": halo_rows * width * element, "cut_x_feature_bytes": cut * width * element,
            "nnz": sum(r["nnz"] for r in ranks), "rows_per_rank": ";".join(str(r["rows"]) for r in ranks),
            "nnz_per_rank": ";".join(str(r["nnz"]) for r in ranks),
            "halo_per_rank": ";".join(str(r["halo"]) for r in ranks), "build_s": built["build_s"],
            "build_peak_gb_per_rank": ";".join(f"{r['build_peak']:.2f}" for r in ranks),
            "peak_gb_per_rank": ";".join(f"{g['peak']:.2f}" for g in gathered),
            "peak_gb": max(g["peak"] for g in gathered)}


def parameter_bytes(args, element_size: int = 4) -> int:
    sizes = [args.features] + [args.hidden] * (args.layers - 1) + [args.classes]
    return element_size * sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def calibration(rows: list[dict]) -> tuple[dict, Measured]:
    fits = [r for r in rows if r["gpus"] == "1" and r["status"] == "ok"]
    if not fits:
        raise SystemExit("--predict needs a one-GPU row that ran (status ok)")
    one = fits[0]
    links = [float(r["link_gbps"]) for r in rows if r["graph"] == one["graph"] and r["gpus"] != "1" and r["link_gbps"]]
    if not links:
        raise SystemExit(f"--predict needs a multi-GPU row of {one['graph']} with its link bandwidth")
    sparse_s, epoch_s = float(one["sparse_ms"]) / 1e3, float(one["epoch_ms"]) / 1e3
    graph_bytes = float(one["graph_gb"]) * 2**30
    measured = Measured(int(one["nodes"]), int(one["nnz"]), sparse_s, max(epoch_s - sparse_s, 0.0), graph_bytes,
                        float(one["peak_gb"]) * 2**30 - graph_bytes, links[0] * 1e9)
    return one, measured


def scaled(measured: Measured, nodes: int, nnz: int, link_bytes_per_s: float) -> Measured:
    """The one-GPU terms of another graph: sparse work and graph bytes follow the nonzeros, the
    rest the rows."""
    by_nnz, by_rows = nnz / measured.nnz, nodes / measured.nodes
    return Measured(nodes, nnz, measured.sparse_s * by_nnz, measured.dense_s * by_rows, measured.graph_bytes * by_nnz,
                    measured.train_bytes * by_rows, link_bytes_per_s, measured.latency_s)


def baseline(rows: list[dict], graph: str) -> dict[int, dict]:
    """Per GPU count, the measured row the model describes: the exchange without overlap in
    32 bits where measured, else the first row that ran."""
    chosen = {}
    for row in rows:
        if row["graph"] != graph or row["status"] != "ok":
            continue
        count = int(row["gpus"])
        plain = row.get("config") in ("", None, "plain")
        if count not in chosen or (plain and chosen[count].get("config") not in ("", None, "plain")):
            chosen[count] = row
    return chosen


def prediction_partition(args, out: Path, graph: str, rowptr, col, count: int, row_weight: int) -> NodePartition:
    """The measured run's METIS partition where saved; else METIS (saved) with --partitioner
    metis, else contiguous ranges."""
    path = partition_file(out, graph, args.edge_factor, count, row_weight)
    if count > 1 and path.exists():
        return load_partition(path)
    if args.partitioner == "metis" and count > 1:
        partition = partition_rows(rowptr.cpu(), col.cpu(), count, "metis", row_weight=row_weight)
        save_partition(partition, path)
        return partition
    return partition_rows(rowptr, col, count, "contiguous", row_weight=row_weight)


def predict_main(args) -> None:
    path = Path(args.predict)
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    one, measured = calibration(rows)
    for name in ("features", "hidden", "classes", "layers"):
        setattr(args, name, int(one[name]))
    widths = product_widths(args.features, args.hidden, args.classes, args.layers)
    parts = [int(p) for p in args.parts.split(",")]
    # The graph must be the measured one: R-MAT draws differ between CPU and CUDA generators.
    device = generator_device(args, torch.device("cpu" if one["device"] == "cpu" else "cuda"))
    # Partitions saved by the measurement lie beside its CSV.
    saved = path.parent
    results = []
    for graph in dict.fromkeys(r["graph"] for r in rows):
        rowptr, col, num_nodes = graph_csr(int(graph.removeprefix("rmat")), args.edge_factor, device)
        nnz = col.numel() + num_nodes
        measured_rows = baseline(rows, graph)
        overlapped = {int(r["gpus"]): r for r in rows
                      if r["graph"] == graph and r["status"] == "ok" and r.get("config") == "overlap"}
        weights = [int(r["row_weight"]) for r in measured_rows.values() if r.get("row_weight")]
        row_weight = args.row_weight if args.row_weight is not None else (weights[0] if weights else 0)
        for count in parts:
            start = time.perf_counter()
            partition = prediction_partition(args, saved, graph, rowptr, col, count, row_weight)
            link = measured.link_bytes_per_s if count <= args.gpus_per_node else args.network_gbps * 1e9
            shape = part_shape(partition, rowptr, col)
            guess = predict(shape, scaled(measured, num_nodes, nnz, link), widths, parameter_bytes(args))
            seen = measured_rows.get(count, {})
            results.append({"graph": graph, "gpus": count, "partitioner": partition.method, "row_weight": row_weight,
                            "predicted_epoch_ms": 1000 * guess.epoch_s,
                            "predicted_overlapped_epoch_ms": 1000 * guess.overlapped_epoch_s,
                            "predicted_compute_ms": 1000 * guess.compute_s,
                            "predicted_exchange_ms": 1000 * guess.exchange_s,
                            "predicted_peak_gb": guess.memory_bytes / 2**30, "halo_rows": guess.halo_rows,
                            "measured_epoch_ms": seen.get("epoch_ms", ""), "measured_peak_gb": seen.get("peak_gb", ""),
                            "measured_config": seen.get("config", ""),
                            "measured_overlapped_epoch_ms": overlapped.get(count, {}).get("epoch_ms", ""),
                            "model_s": time.perf_counter() - start})
            print(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in results[-1].items()),
                  flush=True)
            if seen and count > 1:
                print(validation_line(results[-1]), flush=True)
        del rowptr, col
    print(f"wrote {write_csv(out_dir(args.out) / 'distributed_model.csv', results)}")


def validation_line(result: dict) -> str:
    epoch, peak = float(result["measured_epoch_ms"]), float(result["measured_peak_gb"])
    line = (f"{result['graph']} on {result['gpus']} GPUs [{result['partitioner']}, {result['measured_config']}]: "
            f"predicted epoch {result['predicted_epoch_ms']:.1f} ms vs measured {epoch:.1f} ms "
            f"({result['predicted_epoch_ms'] / epoch:.2f}x), peak {result['predicted_peak_gb']:.2f} GB vs "
            f"measured {peak:.2f} GB ({result['predicted_peak_gb'] / peak:.2f}x)")
    if result["measured_overlapped_epoch_ms"]:
        overlapped = float(result["measured_overlapped_epoch_ms"])
        line += (f"; overlapped epoch {result['predicted_overlapped_epoch_ms']:.1f} ms vs measured {overlapped:.1f} ms "
                 f"({result['predicted_overlapped_epoch_ms'] / overlapped:.2f}x)")
    return line


def measure(args, device: torch.device) -> list[dict]:
    """Every graph of ``args.scales`` on one GPU (rank 0) and on all ranks; rank 0 writes the CSV.
    Every rank of the initialized world calls it."""
    single = not args.no_single and dist.get_world_size() > 1
    # A one-rank group for rank 0's single-GPU run: every rank takes part in creating it.
    group_of_one = dist.new_group([0]) if single else None
    rows = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.reference, row_weight = None, args.row_weight
    bandwidth = None
    for scale in args.scales:
        args.scale, args.num_nodes = scale, 1 << scale
        common = {"graph": f"rmat{scale}", "nodes": args.num_nodes, "device": name, "features": args.features,
                  "hidden": args.hidden, "classes": args.classes, "layers": args.layers}
        box = [row_weight]
        if single:
            if dist.get_rank() == 0:
                rows.append(common | {"gpus": 1, "partitioner": "none"} | single_gpu(args, device, group_of_one))
                print(format_row(rows[-1]), flush=True)
                if args.row_weight is None and rows[-1]["status"] == "ok":
                    box[0] = measured_row_weight(rows[-1])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            dist.broadcast_object_list(box, src=0)
        row_weight = box[0]
        args.current_row_weight = 0 if row_weight is None else row_weight
        built = build_parts(args, device)
        if dist.get_rank() == 0:
            print(format_parts(common["graph"], built), flush=True)
        if bandwidth is None:
            bandwidth = link_bandwidth(device, args.link_mb << 20)
        for config in args.configs:
            rows.append(common | {"gpus": dist.get_world_size(), "link_gbps": bandwidth / 1e9}
                        | train_config(args, device, built, config))
            if dist.get_rank() == 0:
                print(format_row(rows[-1]), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if dist.get_rank() == 0:
        print(f"wrote {write_csv(out_dir(args.out) / 'distributed.csv', rows, FIELDS)}")
    # No rank leaves while another still talks to it (gloo aborts on a peer's closed socket).
    dist.barrier()
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.predict:
        predict_main(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a GPU; --device cpu runs the smoke test on gloo")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        device = torch.device("cpu")
        if args.device == "cuda":
            device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
            torch.cuda.set_device(device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        measure(args, device)
    finally:
        dist.destroy_process_group()


def format_parts(graph: str, built: dict) -> str:
    ranks = built["ranks"]
    partition = built["partition"]
    shapes = "; ".join(f"rank {i}: {r['rows']} rows, {r['nnz']} nnz, {r['halo']} halo" for i, r in enumerate(ranks))
    return f"{graph} parts [{partition.method}], built in {built['build_s']:.1f} s: {shapes}"


def format_row(row: dict) -> str:
    if row["status"] != "ok":
        peak = row["peak_gb"]
        return f"{row['graph']} on {row['gpus']} GPU(s): {row['status']}" + ("" if peak != peak else f" (peak {peak:.1f} GB)")
    config = f", {row['config']}" if row.get("config") else ""
    return (f"{row['graph']} on {row['gpus']} GPU(s) [{row['partitioner']}{config}]: epoch {row['epoch_ms']:.1f} ms "
            f"(exchange {row['exchange_ms']:.1f}, compute {row['compute_ms']:.1f}), halo {row['halo_rows']} rows "
            f"for {row['cut_nonzeros']} cut nonzeros, build {row['build_s']:.1f} s, peak {row['peak_gb_per_rank']} GB")


if __name__ == "__main__":
    main()
