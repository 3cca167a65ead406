"""Before / after comparison over repeated, interleaved benchmark rounds.

A host-bound product of a few microseconds moves by more than the change being measured from one
process to the next, so one run of each side proves nothing. ``scripts/gpu_check.sh`` with
``BASELINE`` and ``ROUNDS`` alternates the two sides' benchmark processes on one machine; this
takes the median of each cell over the rounds of each side and prints after / before.

    python -m benchmarks.compare spmm RESULTS/bench-baseline-* --after RESULTS/bench-after-*
    python -m benchmarks.compare host RESULTS/host_overhead-baseline-*.log \
        --after RESULTS/host_overhead-after-*.log

``spmm`` reads each folder's ``spmm.csv`` and compares the fastest of the kernel paths both
sides time (and the per-call time of ``A @ X`` where measured); ``host`` reads the printed tables
of ``benchmarks/host_overhead.py`` (microseconds per call, per layer).
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
from pathlib import Path

KERNEL_COLUMNS = ("base_ms", "balanced_ms", "rows_ms", "grouped_ms")
LARGE_NNZ = 1_000_000
HOST_ROW = re.compile(r"^  (?P<label>\S.*?)\s{2,}(?P<value>[0-9.]+)$")
HOST_MS = re.compile(r"^  (?P<label>first choice|GCN training step)\D.*?(?P<value>[0-9.]+) ms")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def spmm_cells(folder: Path) -> dict:
    """(graph, N, dtype) -> {"fastest_us", "per_call_us", "nnz"} of one round."""
    cells = {}
    with open(folder / "spmm.csv", newline="") as f:
        for row in csv.DictReader(f):
            times = [_number(row[c]) for c in KERNEL_COLUMNS if c in row]
            times = [t for t in times if not math.isnan(t)]
            cells[(row["graph"], int(row["N"]), row["dtype"])] = {
                "fastest_us": min(times) * 1e3,
                "per_call_us": _number(row.get("us_per_call", "nan")),
                "nnz": int(row["nnz"]),
            }
    return cells


def host_cells(log: Path) -> dict:
    """(graph dtype, layer) -> microseconds per call of one round; layer labels lose the path
    name in brackets so that the two sides' rows meet even when they chose differently."""
    cells, section = {}, None
    for line in log.read_text().splitlines():
        match = HOST_ROW.match(line)
        timed = HOST_MS.match(line)
        if match and section:
            label = re.sub(r"\s*\(.*?\)", "", match["label"]).strip()
            cells[(section, label)] = {"us": float(match["value"])}
        elif timed and section:
            cells[(section, timed["label"])] = {"us": float(timed["value"]) * 1e3}
        elif line and not line.startswith(" ") and len(line.split()) == 2:
            section = line.strip()
    return cells


def medians(rounds: list[dict]) -> dict:
    """Per cell and field, the median over the rounds holding that cell."""
    out = {}
    for key in set().union(*rounds):
        present = [r[key] for r in rounds if key in r]
        out[key] = {field: statistics.median(p[field] for p in present) for field in present[0]}
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(before: dict, after: dict, field: str, group) -> None:
    ratios: dict[str, list] = {}
    for key in sorted(set(before) & set(after)):
        b, a = before[key][field], after[key][field]
        if math.isnan(a) or math.isnan(b) or b <= 0:
            continue
        ratios.setdefault(group(key, before[key]), []).append((a / b, key, b, a))
    for name, items in ratios.items():
        values = [r for r, *_ in items]
        worst = max(items)
        print(f"{field} {name}: after / before geomean {geomean(values):.3f}, median "
              f"{statistics.median(values):.3f}, max {worst[0]:.3f} ({' '.join(map(str, worst[1]))}: "
              f"{worst[2]:.1f} -> {worst[3]:.1f} us), {sum(v > 1.03 for v in values)} of {len(values)} over 1.03")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("spmm", "host"))
    parser.add_argument("before", nargs="+", help="the baseline's rounds")
    parser.add_argument("--after", nargs="+", required=True, help="the rounds of the change")
    args = parser.parse_args(argv)
    sides = args.before, args.after
    read = spmm_cells if args.kind == "spmm" else host_cells
    before, after = (medians([read(Path(p)) for p in side]) for side in sides)
    print(f"{len(sides[0])} rounds before, {len(sides[1])} after; medians per cell")
    if args.kind == "spmm":
        size = lambda key, cell: "large" if cell["nnz"] >= LARGE_NNZ else "small"
        report(before, after, "fastest_us", size)
        report(before, after, "per_call_us", size)
    else:
        report(before, after, "us", lambda key, cell: key[1])


if __name__ == "__main__":
    main()
