"""GPU memory of building a TCSparseTensor from a CUDA CSR, in bytes per nonzero above the input.

    python -m benchmarks.build_memory --scale 20
    python -m benchmarks.build_memory --scale 22 --sorted      # columns already ascending in each row

The input is an R-MAT graph's CSR on the GPU (int64 rowptr and columns, float32 values; by
default the columns of each row shuffled, as a partition's rows arrive). For each phase of the
build, torch.cuda.max_memory_allocated above what was allocated before it, per nonzero, and
what the phase keeps: the canonical CSR (``formats.inputs.from_csr``: sorting, summing
duplicates, index dtypes), the structure (``conversion.build_structure``: the kernels' formats),
the whole ``TCSparseTensor.from_csr``, its transpose (``.t()``, built once for the backward
pass), and a distributed part (``GraphPart.from_rows`` of a rank alone: the whole matrix as its
interior block, its transposes included). Writes
build_memory.csv into --out (default $OUT, else ./out).
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.common import out_dir, write_csv
from graph_data import synthetic
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.conversion import build_structure
from torch_tcsparse.formats import inputs

# The bytes per nonzero a build may peak at above its input CSR.
BUDGET = 16


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=20, help="R-MAT scale: 2**scale nodes")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--sorted", action="store_true", help="keep each row's columns ascending")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.scale <= 30:
        raise SystemExit(f"--scale must be in [1, 30], got {args.scale}")
    if args.edge_factor < 1:
        raise SystemExit(f"--edge-factor must be at least 1, got {args.edge_factor}")
    return args


def input_csr(args, device):
    """rowptr, col, values of the R-MAT graph on ``device``; each row's columns shuffled unless
    ``--sorted``."""
    row, col, num_nodes = synthetic.rmat(args.scale, edge_factor=args.edge_factor, seed=1, device=device)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(row, minlength=num_nodes), 0, out=rowptr[1:])
    if not args.sorted:
        gen = torch.Generator(device=device)
        gen.manual_seed(2)
        # Sorting by (row, random) shuffles the columns inside each row.
        noise = torch.rand(col.numel(), generator=gen, device=device)
        col = col[torch.argsort(row.double() + noise)]
    del row
    values = torch.rand(col.numel(), device=device) + 0.5
    return rowptr, col, values, num_nodes


def measured(name: str, build, nnz: int, device) -> tuple[dict, object]:
    """Peak and kept bytes per nonzero of ``build()`` above what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = build()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    kept = torch.cuda.memory_allocated(device) - before
    row = {"phase": name, "nnz": nnz, "peak_bytes_per_nnz": peak / nnz, "kept_bytes_per_nnz": kept / nnz,
           "peak_gb": peak / 2**30, "within_budget": peak <= BUDGET * nnz}
    print(f"{name}: peak {row['peak_bytes_per_nnz']:.1f} B/nnz ({row['peak_gb']:.2f} GB), "
          f"keeps {row['kept_bytes_per_nnz']:.1f} B/nnz", flush=True)
    return row, result


def measure(args, device) -> list[dict]:
    from torch_tcsparse.distributed import EmulatedPeers, GraphPart

    rowptr, col, values, num_nodes = input_csr(args, device)
    nnz = col.numel()
    print(f"rmat{args.scale}: {num_nodes} nodes, {nnz} nonzeros, columns {'sorted' if args.sorted else 'shuffled'} "
          f"in each row; budget {BUDGET} B/nnz above the input", flush=True)
    rows = []
    row, csr = measured("canonical CSR", lambda: inputs.from_csr(rowptr, col, values, (num_nodes, num_nodes)),
                        nnz, device)
    rows.append(row)
    row, structure = measured("structure", lambda: build_structure(csr, 16, "none", None, 0), nnz, device)
    rows.append(row)
    del csr, structure
    row, matrix = measured("TCSparseTensor.from_csr",
                           lambda: TCSparseTensor.from_csr(rowptr, col, values, shape=(num_nodes, num_nodes)),
                           nnz, device)
    rows.append(row)
    row, transpose = measured("transpose", matrix.t, nnz, device)
    rows.append(row)
    del matrix, transpose
    alone = EmulatedPeers(0, 1, [torch.zeros(0, dtype=torch.long)])
    row, part = measured("GraphPart.from_rows (one rank)",
                         lambda: GraphPart.from_rows(rowptr, col, values, (0, num_nodes), alone), nnz, device)
    rows.append(row)
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("build_memory measures CUDA memory: it needs a GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    rows = measure(args, device)
    for row in rows:
        row |= {"graph": f"rmat{args.scale}", "sorted": args.sorted, "device": torch.cuda.get_device_name(device)}
    print(f"wrote {write_csv(out_dir(args.out) / 'build_memory.csv', rows)}")


if __name__ == "__main__":
    main()
