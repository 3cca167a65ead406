"""The selector's prices that depend on a layout's sizes and a row order, measured and fitted.

Two parts of the C++ model (``torch_tcsparse/csrc/selector_model.h``) are fitted here rather
than by the calibration (``torch_tcsparse.selector.calibrate``), because they are properties of
the kernels, not of the host:

- the grouped kernel's prices (``grouped_prices``): fixed + block x blocks + step x warp-steps
  (whole GPU) + a price per MB of Y: the fp32 sums it zeroes and adds into atomically (rows x N x
  4 bytes), or, where it writes a 16-bit Y itself (every group one chunk, nothing left to the rows
  kernel), Y's own bytes. Relative least squares on the kernel's time (float32: the kernel alone;
  16 bits: the path, whose fixed part holds the rounding launch);
- the rows kernel's order gain (``rows_order_gain``): a reordered matrix's rows time over its
  time as given, ``1 - gain x beyond x (1 - share)``, ``share`` the order's distinct-column share
  (``reorder.locality.share_ratio``) and ``beyond`` the share of X that L2 cannot hold; least
  squares per element size.

Graphs: the corpus's families at ``--nnz`` nonzeros each, in the orders of ``--orders``, and the
suite's graphs the grouped path serves. Only the "fit" families and the suite are fitted; the
"unseen" families are scored apart. The measurements are written to ``layout_prices.csv``;
``--from FILE`` refits saved ones without a GPU.

    python -m benchmarks.layout_prices --nnz 4e6,16e6
    python -m benchmarks.layout_prices --from benchmarks/results/layout_prices_h200.csv
"""
from __future__ import annotations

import argparse
import csv
import math

import numpy as np
import torch

from benchmarks.common import l2_bytes, out_dir, time_cuda, write_csv
from graph_data import corpus

NS = (32, 128)
SUITE_NS = (32, 64, 128, 256)  # the suite's graphs are small: every N bucket costs little
DTYPES = ("float32", "float16")
# The suite's graphs with a grouped layout and nothing left to the rows kernel (benchmarks.spmm),
# in the order the SpMM benchmark runs them.
SUITE = {"band_16384_b64": "none", "uniform_4267_d900": "none", "ogbl_ddi": "tca"}
GROUPED_PRICES = ("fixed_us", "block_ns", "step_ns", "sums_us_per_mb", "direct_us_per_mb")


def measure(name: str, split: str, row, col, shape, order: str, ns) -> dict:
    """One matrix in one order: its grouped layout's sizes, the grouped kernel's time (alone, into
    fp32 sums), the grouped path's and the rows path's, and the model's rows share ratio."""
    from torch_tcsparse import TCSparseTensor, kernels
    from torch_tcsparse.engines.grouped import GROUPED, grouped_layout
    from torch_tcsparse.product import launcher

    values = torch.rand(row.numel(), device=row.device) + 0.5
    matrix = TCSparseTensor.from_coo(row, col, values, shape, reorder=order)
    structure = matrix._structure
    layout = grouped_layout(structure)
    record = {"graph": name, "split": split, "order": matrix.reorder_method, "rows": shape[0], "cols": shape[1],
              "nnz": matrix.nnz, "blocks": layout.num_blocks, "rest_nnz": layout.rest_nnz,
              "one_chunk": layout.one_chunk_per_group, "share": structure.selection.rows_share_ratio,
              "l2_bytes": l2_bytes(), "ns": list(ns)}
    arrays = layout.kernel_arrays()
    for dtype_name in DTYPES:
        typed = matrix.to(getattr(torch, dtype_name))
        _, fragments, _ = GROUPED.operands(GROUPED.indices(typed._structure, typed.dtype), typed._values)
        for n in ns:
            xs = [(torch.randn(shape[1], n, device=row.device).to(typed.dtype),) for _ in range(2)]
            key = f"{dtype_name}_{n}"
            record["kernel_" + key] = 1e3 * time_cuda(
                lambda x: kernels.grouped_spmm(x, fragments, arrays, layout.num_rows, None, keep_fp32=True), xs, reps=10)
            record["grouped_" + key] = 1e3 * time_cuda(launcher(typed, "grouped"), xs, reps=10)
            record["rows_" + key] = 1e3 * time_cuda(launcher(typed, "rows"), xs, reps=10)
    return record


def graphs(nnz_targets, orders):
    """(name, split, loader, order) of every measurement: the corpus's families, then the suite's."""
    from benchmarks.spmm import suite

    for target in nnz_targets:
        for split, families in corpus.SPLIT.items():
            for family in families:
                for order in orders:
                    yield f"{family}_{target / 1e6:g}M", split, (lambda f=family, t=target: corpus.generate(f, int(t), seed=0, device="cuda")), order
    loaders = suite()
    for name, order in SUITE.items():
        if name in loaders:
            yield name, "suite", (lambda name=name: loaders[name]("cuda")), order


def grouped_features(r: dict, n: int, value_bytes: int) -> list[float]:
    """The grouped prices' features of record ``r`` at N = ``n``: 1, blocks, warp-steps (both in
    thousands), MB of fp32 sums, MB of a 16-bit Y written directly."""
    direct = value_bytes < 4 and r["one_chunk"] and r["rest_nnz"] == 0
    steps = r["blocks"] * math.ceil(n / 32)
    y_mb = r["rows"] * n / 1e6
    return [1.0, r["blocks"] / 1e3, steps / 1e3, 0.0 if direct else 4 * y_mb, value_bytes * y_mb if direct else 0.0]


def fit_grouped(records: list[dict], value_bytes: int):
    """The grouped prices for ``value_bytes``, and the relative errors per split."""
    points = []
    for r in records:
        for n in r["ns"]:
            key = f"{'float32' if value_bytes == 4 else 'float16'}_{n}"
            # float32: the kernel alone (rest nonzeros are the rows kernel's price); 16 bits: the
            # path, where nothing is left to the rows kernel.
            if value_bytes == 4:
                time_us = r["kernel_" + key]
            elif r["rest_nnz"] == 0:
                time_us = r["grouped_" + key]
            else:
                continue
            points.append((r["split"], grouped_features(r, n, value_bytes), time_us))
    used = [0, 1, 2, 3] if value_bytes == 4 else [0, 1, 2, 3, 4]
    fitted = [(f, t) for split, f, t in points if split in ("fit", "suite")]
    design = np.array([[f[i] / t for i in used] for f, t in fitted])
    solution = np.linalg.lstsq(design, np.ones(len(fitted)), rcond=None)[0]
    prices = np.zeros(len(GROUPED_PRICES))
    prices[used] = solution
    return prices, errors(points, lambda f: float(np.dot(prices, f)))


def fit_order_gain(records: list[dict], value_bytes: int):
    """The rows order gain for ``value_bytes``, and the relative errors per split."""
    given = {r["graph"]: r for r in records if r["order"] == "none"}
    points = []
    for r in records:
        if r["order"] == "none" or r["graph"] not in given:
            continue
        for n in r["ns"]:
            key = f"{'float32' if value_bytes == 4 else 'float16'}_{n}"
            beyond = max(0.0, 1.0 - r["l2_bytes"] / (r["cols"] * n * value_bytes))
            points.append((r["split"], beyond * (1.0 - r["share"]), r["rows_" + key] / given[r["graph"]]["rows_" + key]))
    x = np.array([f for split, f, _ in points if split == "fit"])
    y = np.array([1.0 - ratio for split, _, ratio in points if split == "fit"])
    gain = float(x @ y / (x @ x)) if x.size and x @ x > 0 else 0.0
    return gain, errors(points, lambda f: 1.0 - gain * f)


def errors(points, predict) -> dict:
    """Per split: (count, rms of predicted / measured - 1, lowest and highest ratio)."""
    out = {}
    for split in sorted({p[0] for p in points}):
        ratios = np.array([predict(f) / t for s, f, t in points if s == split])
        out[split] = (len(ratios), float(np.sqrt(np.mean((ratios - 1) ** 2))), float(ratios.min()), float(ratios.max()))
    return out


def report(records: list[dict]) -> None:
    for value_bytes in (4, 2):
        prices, grouped_errors = fit_grouped(records, value_bytes)
        gain, gain_errors = fit_order_gain(records, value_bytes)
        print(f"{value_bytes}-byte values: grouped " + ", ".join(f"{k} {v:.4g}" for k, v in zip(GROUPED_PRICES, prices))
              + f"; rows order gain {gain:.3f}")
        for what, table in (("grouped", grouped_errors), ("order gain", gain_errors)):
            for split, (count, rms, low, high) in table.items():
                print(f"  {what:<10} {split:<7} {count:>4} points, rms {rms:.3f}, predicted / measured {low:.2f}..{high:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnz", default="4e6,16e6", help="comma-separated nonzeros per corpus graph")
    parser.add_argument("--orders", default="none,tca,community", help="row orders ('none' first: the gain's reference)")
    parser.add_argument("--from", dest="saved", help="refit saved measurement lines instead of measuring")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.saved:
        report(read_records(args.saved))
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.layout_prices times CUDA kernels and found no CUDA device; "
                         "refit saved measurements with --from FILE")
    orders = args.orders.split(",")
    if orders[0] != "none":
        raise SystemExit(f"--orders must start with 'none' (the order the gain is measured against), got {args.orders!r}")
    records = []
    for name, split, load, order in graphs([float(v) for v in args.nnz.split(",")], orders):
        row, col, nodes = load()[:3]
        shape = tuple(nodes) if isinstance(nodes, tuple) else (nodes, nodes)
        record = measure(name, split, row, col, shape, order, SUITE_NS if split == "suite" else NS)
        records.append(record)
        print(f"{name} {record['order']}: blocks {record['blocks']}, rest {record['rest_nnz']}, "
              f"grouped float32 N=128 {record['grouped_float32_128']:.1f} us, rows {record['rows_float32_128']:.1f} us",
              flush=True)
        del row, col
        torch.cuda.empty_cache()
    path = write_csv(out_dir(args.out) / "layout_prices.csv",
                     [{**r, "ns": ";".join(map(str, r["ns"]))} for r in records])
    print(f"wrote {path}")
    report(records)


def read_records(path: str) -> list[dict]:
    """Saved measurements (``layout_prices.csv``) as ``measure`` returned them."""
    text = {"graph", "split", "order"}
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    records = []
    for row in rows:
        r = {k: v for k, v in row.items() if v != ""}
        for key, value in r.items():
            if key == "ns":
                r[key] = [int(n) for n in value.split(";")]
            elif key == "one_chunk":
                r[key] = value == "True"
            elif key not in text:
                r[key] = float(value)
        records.append(r)
    return records


if __name__ == "__main__":
    main()
