"""The benchmark's command line: the run on torchrun's ranks, the single-GPU rank emulation and the
model (``--predict``). Errors in the command are one line, printed once (by rank 0 under
torchrun), and every rank exits with the same nonzero code."""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from benchmarks.common import out_dir, write_csv
from torch_tcsparse.distributed.partition import METHODS
from torch_tcsparse.distributed.placement import CLUSTER_METHODS, GATHERS

from . import emulation, prediction, ranks, rebalance, single
from .errors import fail
from .progress import Progress
from .training import CONFIGS, imbalances_for, partition_weights

FIELDS = ["graph", "nodes", "nnz", "gpus", "device", "partitioner", "row_weight", "config", "overlap", "halo_bits",
          "status", "losses", "epoch_ms", "compute_ms", "exchange_ms", "exchange_ms_per_rank", "halo_rows",
          "cut_nonzeros", "exchanged_width", "halo_bytes_per_epoch", "cut_x_feature_bytes", "rows_per_rank",
          "nnz_per_rank", "cut_per_rank", "halo_per_rank", "send_per_rank", "generate_s", "partition_s",
          "partition_peak_gb", "build_s", "sparse_ms", "graph_gb", "graph_gb_per_rank", "link_gbps", "copy_gbps",
          "single_gb_needed", "build_peak_gb_per_rank", "peak_gb_per_rank", "peak_gb", "features", "hidden",
          "classes", "layers"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(message)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        fail(f"{name} takes a comma list of ints, got {text!r}")
    if any(v < 1 for v in values):
        fail(f"{name} entries must be at least 1, got {text!r}")
    return values


def parse_args(argv=None):
    parser = _Parser(description=sys.modules[__package__].__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="22,24", help="comma list of R-MAT scales, measured in this order")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--partitioner", choices=METHODS, default="auto",
                        help="auto: the multilevel partitioner, on the partitioning rank's GPU")
    parser.add_argument("--gather", choices=GATHERS, default="auto",
                        help="what the partitioning rank receives: every block's structure, or the graph of the "
                             "clusters each rank makes of its block (multilevel only); auto: the clusters for the "
                             "multilevel partitioner under torchrun, else the structure")
    parser.add_argument("--row-weight", default=None,
                        help="a row's weight beside its nonzeros, or a comma list of them (one balanced constraint "
                             "each; default: the one-GPU run's time and memory per row in nonzeros)")
    parser.add_argument("--imbalance", default="0.03,0.15",
                        help="how far above its share of each row weight a part may be, a comma list (the last "
                             "repeated for later weights): 3%% of time (every rank waits for the slowest at each "
                             "exchange), 15%% of memory (which only has to fit under 1.2 times its share plus the "
                             "halo: a memory bound that binds holds rows and nonzeros each near half, which on "
                             "graphs with hubs cuts many times more nonzeros)")
    parser.add_argument("--rebalance", action="store_true",
                        help="partition again with the time weight per row fitted to the first partition's ranks")
    parser.add_argument("--configs", default="plain,overlap,overlap-bf16,plain-bf16",
                        help=f"comma list of exchanges to time on the parts, of {list(CONFIGS)}")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs, after 2 of warm-up")
    parser.add_argument("--no-single", action="store_true", help="skip the one-GPU run")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for a smoke run")
    parser.add_argument("--link-mb", type=int, default=256, help="MB per rank of the all-to-all that times the link")
    parser.add_argument("--emulate", default=None,
                        help="comma list of GPU counts P: build and train each rank of P alone on this GPU (no torchrun)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--predict", default=None,
                        help="a distributed.csv to model, or a comma list of them (no torchrun)")
    parser.add_argument("--parts", default="2,4,8,16,32,64,128,256",
                        help="with --predict: the GPU counts to partition afresh ('none': only the runs' own partitions)")
    parser.add_argument("--link-gbps", type=float, default=None,
                        help="with --predict: GB/s one GPU sends in an all-to-all (default: the measured one)")
    parser.add_argument("--copy-gbps", type=float, default=None,
                        help="with --predict: the GPU's copy bandwidth, GB/s read plus written (default: the "
                             "one-GPU run's; a CSV without it leaves the split's passes over memory unpriced)")
    args = parser.parse_args(argv)
    args.scales = _ints(args.scales, "--scales")
    args.parts = [] if args.parts == "none" else _ints(args.parts, "--parts")
    args.emulate = None if args.emulate is None else _ints(args.emulate, "--emulate")
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        fail(f"--configs takes {list(CONFIGS)}, got {unknown}")
    for name in ("features", "hidden", "classes", "layers", "epochs", "edge_factor"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.row_weight is not None:
        try:
            weights = tuple(int(w) for w in args.row_weight.split(","))
        except ValueError:
            fail(f"--row-weight takes an int or a comma list of ints, got {args.row_weight!r}")
        if any(w < 0 for w in weights):
            fail(f"--row-weight entries must be at least 0, got {args.row_weight!r}")
        args.row_weight = weights
    try:
        args.imbalance = tuple(float(v) for v in args.imbalance.split(","))
    except ValueError:
        fail(f"--imbalance takes a float or a comma list of floats, got {args.imbalance!r}")
    if not all(0 < v < 1 for v in args.imbalance):
        fail(f"--imbalance entries must be in (0, 1), got {args.imbalance}")
    for name in ("link_gbps", "copy_gbps"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.rebalance and args.emulate is not None:
        fail("--rebalance partitions again from the ranks' times under torchrun; --emulate has no ranks to time")
    clusters_possible = args.partitioner in CLUSTER_METHODS and args.emulate is None
    if args.gather == "clusters" and not clusters_possible:
        fail("--gather clusters partitions with the multilevel partitioner across the ranks of a torchrun run, "
             f"got --partitioner {args.partitioner}{' with --emulate' if args.emulate is not None else ''}")
    if args.gather == "auto":
        args.gather = "clusters" if clusters_possible else "whole"
    return args


def set_row_weight(args, single_row: dict | None) -> None:
    """The row weights of this scale's partition: --row-weight, else the one-GPU run's."""
    if args.row_weight is not None:
        weights = args.row_weight
    elif single_row is not None and single_row.get("status") == "ok":
        weights = single.measured_row_weights(single_row | {"nodes": args.num_nodes})
    else:
        weights = args.current_row_weight if hasattr(args, "current_row_weight") else (0,)
    args.current_row_weight = partition_weights(args.partitioner, tuple(weights))
    args.current_imbalance = imbalances_for(args.imbalance, args.current_row_weight)
    args.current_row_weight_text = ";".join(str(w) for w in args.current_row_weight)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def scale_fields(args, scale: int, device) -> dict:
    args.scale, args.num_nodes = scale, 1 << scale
    return {"graph": f"rmat{scale}", "nodes": args.num_nodes, "device": device_name(device), "features": args.features,
            "hidden": args.hidden, "classes": args.classes, "layers": args.layers}


def measure(args, device: torch.device, progress: Progress | None = None) -> list[dict]:
    """Every graph of ``args.scales`` on one GPU (rank 0) and on all ranks; rank 0 writes the CSV.
    Every rank of the initialized world calls it. ``progress`` (default: a new one) prints each
    stage as every rank ends it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = progress or Progress(device, rank, world)
    rows, bandwidth = [], None
    args.reference = None
    csv_path = out_dir(args.out) / "distributed.csv"

    def report(row: dict) -> None:
        # Written again after every row: a run stopped at a time limit keeps what it measured.
        rows.append(row)
        print(format_row(row), flush=True)
        write_csv(csv_path, rows, FIELDS)

    for scale in args.scales:
        common = scale_fields(args, scale, device)
        progress.graph = common["graph"]
        box = [None]
        if rank == 0 and not args.no_single:
            report(common | {"gpus": 1, "partitioner": "none"} | single.single_gpu(args, device))
            box[0] = rows[-1]
        dist.broadcast_object_list(box, src=0)
        if not args.no_single:
            progress("one-GPU run done")
        set_row_weight(args, box[0])
        if rows and rank == 0:
            rows[-1]["row_weight"] = args.current_row_weight_text
        built = ranks.build_parts(args, device, progress)
        if args.rebalance:
            weights = rebalance.rebalanced_weights(args, device, built, progress)
            if rank == 0:
                print(f"{common['graph']} row weights {args.current_row_weight_text} -> "
                      f"{';'.join(map(str, weights))}", flush=True)
            args.current_row_weight, args.current_row_weight_text = weights, ";".join(map(str, weights))
            del built
            built = ranks.build_parts(args, device, progress)
        if rank == 0:
            print(format_parts(common["graph"], built), flush=True)
        if bandwidth is None:
            bandwidth = ranks.link_bandwidth(device, args.link_mb << 20)
            progress("link measured")
        for config in args.configs:
            measured = ranks.train_config(args, device, built, config, progress)
            row = common | {"gpus": world, "link_gbps": bandwidth / 1e9} | measured
            if rank == 0:
                report(row)
            else:
                rows.append(row)
        del built
    if rank == 0:
        print(f"wrote {csv_path}")
    # No rank leaves while another still talks to it (gloo aborts on a peer's closed socket).
    dist.barrier()
    return rows


def measure_emulated(args, device: torch.device) -> tuple[list[dict], list[dict]]:
    """The one-GPU run and every emulated rank of each scale, in this process alone."""
    rows, emulated = [], []
    args.reference = None
    for scale in args.scales:
        common = scale_fields(args, scale, device)
        one = {"status": "skipped"}
        if not args.no_single:
            one = common | {"gpus": 1, "partitioner": "none"} | single.single_gpu(args, device)
            print(format_row(one), flush=True)
        set_row_weight(args, one)
        one["row_weight"] = args.current_row_weight_text
        if not args.no_single:
            rows.append(one)
        emulated += emulation.emulate(args, device, one)
    out = out_dir(args.out)
    if rows:
        print(f"wrote {write_csv(out / 'distributed.csv', rows, FIELDS)}")
    print(f"wrote {write_csv(out / prediction.EMULATED_CSV, emulated)}")
    return rows, emulated


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.predict:
        prediction.predict_main(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda needs a GPU; --device cpu runs the smoke test on gloo")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.emulate is not None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            fail("--emulate runs in one process: start it with python, not torchrun")
        device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
        measure_emulated(args, device)
        return
    if "RANK" not in os.environ:
        fail("the run on several GPUs starts under torchrun (torchrun --nproc-per-node P -m benchmarks.distributed); "
             "on one GPU use --emulate 2,4; --predict models a run")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    progress = Progress(device, dist.get_rank(), dist.get_world_size())
    try:
        measure(args, device, progress)
    except Exception as error:
        # The other ranks may wait for this one in a collective that never completes, and
        # tearing the group down may wait for them: the failure is printed now and the process
        # ends at once, so that torchrun stops the others.
        progress.report_failure(error)
        os._exit(1)
    dist.destroy_process_group()
    # The interpreter's teardown after a finished gloo run sometimes aborts the process ("terminate
    # called without an active exception"), and torchrun then reports a run whose results are
    # written as failed: a rank that finished ends here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def format_parts(graph: str, built: dict) -> str:
    shapes = "; ".join(f"rank {i}: {r['rows']} rows, {r['nnz']} nnz, {r['halo']} halo, build peak {r['build_peak']:.2f} GB"
                       for i, r in enumerate(built["ranks"]))
    root = built["ranks"][0]
    return (f"{graph} parts: generated in {max(r['generate_s'] for r in built['ranks']):.1f} s, partitioned in "
            f"{root['partition_s']:.1f} s (rank 0 peak {root['partition_peak']:.2f} GB); {shapes}")


def format_row(row: dict) -> str:
    if row["status"] != "ok":
        peak = row["peak_gb"]
        return f"{row['graph']} on {row['gpus']} GPU(s): {row['status']}" + ("" if peak != peak else f" (peak {peak:.1f} GB)")
    config = f", {row['config']}" if row.get("config") else ""
    return (f"{row['graph']} on {row['gpus']} GPU(s) [{row['partitioner']}{config}]: epoch {row['epoch_ms']:.1f} ms "
            f"(exchange {row['exchange_ms']:.1f}, compute {row['compute_ms']:.1f}), halo {row['halo_rows']} rows "
            f"for {row['cut_nonzeros']} cut nonzeros, build {row['build_s']:.1f} s, peak {row['peak_gb_per_rank']} GB, "
            f"loss {row['losses'].replace(';', ' ')}")
