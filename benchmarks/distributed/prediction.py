"""``--predict``: the cost model (torch_tcsparse.distributed.model) for P = 2 to 256 GPUs from a
run's one-GPU measurements, each P partitioned by the multilevel partitioner, against every
measured run of the CSVs (and the emulated ranks beside them); and every measured run modelled
on its own partition (the per-rank shape the run recorded), so that the model is checked apart
from the partitioner. A graph with no one-GPU run (one that does not fit a GPU) is modelled
from the one-GPU run of the largest graph with the same network: the model's times and bytes
are per nonzero and per row. Markdown tables for BENCHMARKS.md."""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

from benchmarks.common import out_dir, write_csv
from torch_tcsparse.distributed import partition_rows
from torch_tcsparse.distributed.model import Measured, PartShape, part_shape, predict

from .errors import fail
from .graph import rmat_block
from .training import imbalances_for, network, parameter_bytes, partition_weights

EMULATED_CSV = "distributed_emulated.csv"
NETWORK = ("features", "hidden", "classes", "layers")
MEASURE_FIRST = ("measure first on one GPU: python -m benchmarks.distributed --emulate 2,4 --scales 24 "
                 "(or on several: torchrun --nproc-per-node 2 -m benchmarks.distributed)")


def read_rows(path: Path, source: int = 0) -> list[dict]:
    """The CSV's rows, each tagged with ``source`` (the CSV's place in --predict's list)."""
    if not path.is_file():
        fail(f"--predict reads a run's distributed.csv: {path} does not exist; {MEASURE_FIRST}")
    with open(path, newline="") as handle:
        return [row | {"source": source} for row in csv.DictReader(handle)]


def calibrations(rows: list[dict]) -> dict[str, dict]:
    """Per graph, its first one-GPU row that ran; a graph whose one-GPU runs all failed (did not
    fit, say) is said and left out, since the model scales from that run."""
    ran = {}
    for row in rows:
        if row["gpus"] == "1" and row["status"] == "ok":
            ran.setdefault(row["graph"], row)
    for graph in dict.fromkeys(r["graph"] for r in rows if r["gpus"] == "1"):
        if graph not in ran:
            print(f"{graph}: no one-GPU run that ran, not modelled")
    if not ran:
        fail(f"--predict needs a one-GPU row that ran (status ok); {MEASURE_FIRST}")
    return ran


def link_bytes_per_s(args, rows: list[dict]) -> float:
    """The link's all-to-all bandwidth: --link-gbps where given, else the measured one."""
    if args.link_gbps is not None:
        return args.link_gbps * 1e9
    links = [float(r["link_gbps"]) for r in rows if r.get("link_gbps")]
    if not links:
        fail("--predict needs the link's bandwidth: give --link-gbps (GB/s one GPU sends in an "
                         "all-to-all), or measure it with torchrun --nproc-per-node 2 -m benchmarks.distributed")
    return links[0] * 1e9


def measured_of(one: dict, link: float, copy_gbps: float | None = None) -> Measured:
    """The model's one-GPU inputs from ``one``; the copy bandwidth is ``copy_gbps`` where given,
    else the one-GPU run's, else unpriced (infinite)."""
    sparse_s, epoch_s = float(one["sparse_ms"]) / 1e3, float(one["epoch_ms"]) / 1e3
    graph_bytes = float(one["graph_gb"]) * 2**30
    if copy_gbps is None:
        copy_gbps = float(one["copy_gbps"]) if one.get("copy_gbps") else float("inf")
    return Measured(int(one["nodes"]), int(one["nnz"]), sparse_s, max(epoch_s - sparse_s, 0.0), graph_bytes, link,
                    copy_bytes_per_s=copy_gbps * 1e9)


def measured_runs(rows: list[dict]) -> dict[tuple, dict]:
    """Per (CSV, graph, GPU count), the run the model describes: the exchange without overlap
    in 32 bits where measured, else the first that ran; with the overlapped epoch where
    measured."""
    chosen = {}
    for row in rows:
        if row["status"] != "ok" or row["gpus"] == "1":
            continue
        key = (row["source"], row["graph"], int(row["gpus"]))
        if key not in chosen or row.get("config") == "plain":
            overlapped = chosen.get(key, {}).get("overlapped_epoch_ms")
            chosen[key] = dict(row) | ({"overlapped_epoch_ms": overlapped} if overlapped else {})
        if row.get("config") == "overlap":
            chosen[key]["overlapped_epoch_ms"] = row["epoch_ms"]
    return chosen


def run_shape(run: dict) -> PartShape | None:
    """The part shapes the run recorded (None for a run written before it recorded each
    rank's cut nonzeros)."""
    if not run.get("cut_per_rank"):
        return None
    columns = [torch.tensor([int(v) for v in run[key].split(";")], dtype=torch.long)
               for key in ("rows_per_rank", "nnz_per_rank", "halo_per_rank", "send_per_rank", "cut_per_rank")]
    return PartShape(*columns)


def calibration_for(run: dict, graphs: dict[str, dict]) -> dict | None:
    """The one-GPU row the model scales from for ``run``: its graph's, else that of the graph
    with the most nonzeros among those trained with the same network."""
    if run["graph"] in graphs:
        return graphs[run["graph"]]
    same = [one for one in graphs.values() if all(one[k] == run[k] for k in NETWORK)]
    return max(same, key=lambda one: int(one["nnz"]), default=None)


def emulated_peaks(path: Path, graph: str) -> dict[int, tuple[float, float]]:
    """Per P, the largest emulated rank's peak and compute time, where an emulation ran."""
    if not path.is_file():
        return {}
    with open(path, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["graph"] == graph]
    result = {}
    for row in rows:
        if not float(row["peak_gb"]) > 0:
            continue
        peak, compute = result.get(int(row["gpus"]), (0.0, 0.0))
        result[int(row["gpus"])] = (max(peak, float(row["peak_gb"])), max(compute, float(row["compute_ms"])))
    return result


def predict_main(args) -> None:
    paths = [Path(p) for p in args.predict.split(",")]
    rows = [row for source, path in enumerate(paths) for row in read_rows(path, source)]
    graphs = calibrations(rows)
    link = link_bytes_per_s(args, rows)
    device = torch.device("cpu" if rows[0]["device"] == "cpu" or not torch.cuda.is_available() else "cuda")
    runs = measured_runs(rows)
    results = []
    # The afresh partitions generate each graph whole; ``--parts none`` skips them.
    for graph, one in graphs.items() if args.parts else ():
        for name in NETWORK:
            setattr(args, name, int(one[name]))
        measured = measured_of(one, link, args.copy_gbps)
        # Afresh partitions are checked against the first CSV's runs of the graph.
        first_runs = {count: run for (source, name, count), run in runs.items() if name == graph and source == 0}
        emulated = emulated_peaks(paths[0].parent / EMULATED_CSV, graph)
        scale = int(graph.removeprefix("rmat"))
        # The graph must be the measured one: R-MAT draws differ between CPU and CUDA generators.
        rowptr, col = rmat_block(scale, args.edge_factor, 0, 1 << scale, device)
        row_weight = partition_weights(args.partitioner, _row_weights(one))
        for count in args.parts:
            start = time.perf_counter()
            partition = partition_rows(rowptr, col, count, args.partitioner, row_weight=row_weight,
                                       imbalance=imbalances_for(args.imbalance, row_weight))
            partition_s = time.perf_counter() - start
            guess = predict(part_shape(partition, rowptr, col), measured, network(args), parameter_bytes(args))
            peak, compute = emulated.get(count, ("", ""))
            results.append(model_row(guess, one, first_runs.get(count, {}), graph=graph, gpus=count,
                                     partition="afresh", calibrated_on=graph, partitioner=partition.method,
                                     partition_s=partition_s) | {"emulated_peak_gb": peak, "emulated_compute_ms": compute})
            print(validation_line(results[-1]), flush=True)
        del rowptr, col
    if args.copy_gbps is None and not all(one.get("copy_gbps") for one in graphs.values()):
        print("a one-GPU row without copy_gbps: the passes over memory a split adds are not priced (give --copy-gbps)")
    on_runs = [result for result in (on_run_partition(run, graphs, link, args.copy_gbps) for run in runs.values())
               if result]
    for result in on_runs:
        print(validation_line(result), flush=True)
    out = out_dir(args.out)
    print(f"wrote {write_csv(out / 'distributed_model.csv', results + on_runs)}")
    table = (markdown_table(results, link) + "\n" if results else "") + runs_table(on_runs)
    (out / "distributed_model.md").write_text(table)
    print(table)


def on_run_partition(run: dict, graphs: dict[str, dict], link: float, copy_gbps: float | None = None) -> dict | None:
    """The model on the partition the run trained on, against the run; None (and said) for a
    run without per-rank cuts or without a one-GPU row to scale from."""
    shape, one = run_shape(run), calibration_for(run, graphs)
    where = f"{run['graph']} on {run['gpus']} GPUs ({run['partitioner']}, CSV {run['source'] + 1})"
    if shape is None or one is None:
        print(f"{where}: not modelled on its own partition "
              f"({'no per-rank cut in the CSV' if shape is None else 'no one-GPU run of the same network'})")
        return None
    trained = argparse.Namespace(**{name: int(run[name]) for name in NETWORK})
    run_link = float(run["link_gbps"]) * 1e9 if run.get("link_gbps") else link
    guess = predict(shape, measured_of(one, run_link, copy_gbps), network(trained), parameter_bytes(trained))
    return model_row(guess, one, run, graph=run["graph"], gpus=int(run["gpus"]), partition="run",
                     calibrated_on=one["graph"], partitioner=run["partitioner"], partition_s=float(run["partition_s"]))


def model_row(guess, one: dict, run: dict, **identity) -> dict:
    """A row of distributed_model.csv: ``identity`` (graph, gpus, partition, calibrated_on,
    partitioner, partition_s), the model's figures (a speed-up where ``one``, the one-GPU row it
    scaled from, is the graph's own) and the run's where measured."""
    speedup = float(one["epoch_ms"]) / (1000 * guess.epoch_s) if one["graph"] == identity["graph"] else ""
    return identity | {
        "predicted_epoch_ms": 1000 * guess.epoch_s, "predicted_overlapped_epoch_ms": 1000 * guess.overlapped_epoch_s,
        "predicted_speedup": speedup, "predicted_compute_ms": 1000 * guess.compute_s,
        "predicted_exchange_ms": 1000 * guess.exchange_s, "predicted_peak_gb": guess.memory_bytes / 2**30,
        "halo_rows": guess.halo_rows, "measured_epoch_ms": run.get("epoch_ms", ""),
        "measured_overlapped_epoch_ms": run.get("overlapped_epoch_ms", ""), "measured_peak_gb": run.get("peak_gb", ""),
        "emulated_peak_gb": "", "emulated_compute_ms": ""}


def _row_weights(one: dict) -> tuple[int, ...]:
    text = one.get("row_weight") or "0"
    return tuple(int(w) for w in str(text).split(";"))


def validation_line(result: dict) -> str:
    partition = "afresh" if result["partition"] == "afresh" else "the run's partition"
    calibrated = "" if result["calibrated_on"] == result["graph"] else f", scaled from {result['calibrated_on']}"
    speedup = "" if result["predicted_speedup"] == "" else f"{result['predicted_speedup']:.2f}x one GPU, "
    line = (f"{result['graph']} on {result['gpus']} GPUs [{result['partitioner']} {partition}, "
            f"{result['partition_s']:.1f} s{calibrated}]: "
            f"predicted epoch {result['predicted_epoch_ms']:.1f} ms (overlapped {result['predicted_overlapped_epoch_ms']:.1f}), "
            f"{speedup}peak {result['predicted_peak_gb']:.2f} GB per GPU, halo {result['halo_rows']} rows")
    for key, label, predicted in (("measured_epoch_ms", "measured epoch", "predicted_epoch_ms"),
                                  ("measured_overlapped_epoch_ms", "measured overlapped epoch",
                                   "predicted_overlapped_epoch_ms"),
                                  ("measured_peak_gb", "measured peak", "predicted_peak_gb"),
                                  ("emulated_peak_gb", "emulated peak", "predicted_peak_gb"),
                                  ("emulated_compute_ms", "emulated compute", "predicted_compute_ms")):
        value = float(result[key]) if result[key] not in ("", None) else float("nan")
        # Unmeasured (CPU memory) or empty cells are left out.
        if value > 0:
            line += f"; {label} {value:.2f} ({result[predicted] / value:.2f}x)"
    return line


def markdown_table(results: list[dict], link: float) -> str:
    """The model's table for BENCHMARKS.md, measured cells where a run or emulation gave them."""
    lines = [f"Link: {link / 1e9:.0f} GB/s per GPU.", "",
             "| graph | GPUs | epoch ms (overlapped) | speedup | compute / exchange ms | peak GB per GPU | halo rows "
             "| measured epoch ms | measured (emulated) peak GB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        measured_peak = r["measured_peak_gb"] or ""
        if r["emulated_peak_gb"] != "":
            measured_peak = f"{measured_peak} ({float(r['emulated_peak_gb']):.1f})".strip()
        epoch = f"{float(r['measured_epoch_ms']):.1f}" if r["measured_epoch_ms"] else ""
        lines.append(f"| {r['graph']} | {r['gpus']} | {r['predicted_epoch_ms']:.1f} ({r['predicted_overlapped_epoch_ms']:.1f}) "
                     f"| {r['predicted_speedup']:.2f}x | {r['predicted_compute_ms']:.1f} / {r['predicted_exchange_ms']:.1f} "
                     f"| {r['predicted_peak_gb']:.1f} | {r['halo_rows']:,} | {epoch} | {measured_peak} |")
    return "\n".join(lines) + "\n"


def runs_table(results: list[dict]) -> str:
    """The model on each run's own partition, against the run."""
    if not results:
        return ""
    lines = ["| graph | GPUs | scaled from | predicted epoch ms | measured | measured / predicted "
             "| predicted peak GB | measured | measured / predicted |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        epoch, peak = float(r["measured_epoch_ms"]), float(r["measured_peak_gb"])
        lines.append(f"| {r['graph']} | {r['gpus']} | {r['calibrated_on']} | {r['predicted_epoch_ms']:.1f} | {epoch:.1f} "
                     f"| {epoch / r['predicted_epoch_ms']:.2f} | {r['predicted_peak_gb']:.1f} | {peak:.1f} "
                     f"| {peak / r['predicted_peak_gb']:.2f} |")
    return "\n".join(lines) + "\n"
