"""What a reordering's permutation costs a product: ``A @ X`` with the permutation inside the
tensor (the kernels gather X through original column ids and store Y through the row map) against
the same matrix permuted beforehand (B = P A P^T, no permutation: B @ X[perm]), and against doing
the permutation by hand around B (gather X, multiply, scatter Y: the extra passes the kernels
avoid). Every Tensor-Core and CUDA-core path is forced in turn, the three products timed in
interleaved rounds; both matrices have the same blocks per window. Writes permutation.csv into
--out (default $OUT, else ./out) and prints the table last.

    python -m benchmarks.permutation                               # the default graphs, tca order
    python -m benchmarks.permutation --graphs rmat18 --method degree --dtype float16
"""
from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.common import batch_for, out_dir, rotation_count, time_cuda, write_csv
from benchmarks.reorder import graph_table
from torch_tcsparse import TCSparseTensor, kernels
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import reorder

PATHS = ("base", "balanced", "rows", "grouped")
ROUNDS = 5
HEADER = (f"{'graph':<26} {'nnz':>11} {'path':<9} {'blocks':>10} {'inside ms':>10} {'before ms':>10} "
          f"{'by hand ms':>10} {'inside/before':>13} {'by hand/before':>14}")


def tensors(row, col, num_nodes: int, perm: torch.Tensor, dtype: torch.dtype):
    """(A with ``perm`` inside, B = P A P^T as given): B[k, l] = A[perm[k], perm[l]]."""
    values = torch.rand(row.numel(), device=row.device, dtype=torch.float32) + 0.5
    inside = TCSparseTensor.from_coo(row, col, values, shape=(num_nodes, num_nodes), reorder=perm).to(dtype)
    position = torch.empty_like(perm)
    position[perm] = torch.arange(num_nodes, device=perm.device)
    before = TCSparseTensor.from_coo(position[row], position[col], values, shape=(num_nodes, num_nodes)).to(dtype)
    return inside, before, position


def compare(inside, before, perm, position, n: int, dtype: torch.dtype) -> list[dict]:
    """One record per path: the three products' median ms (interleaved rounds), after checking
    that they agree."""
    num_nodes = perm.numel()
    xs = [torch.randn(num_nodes, n, device=perm.device, dtype=dtype)
          for _ in range(rotation_count(num_nodes * n * dtype.itemsize))]
    xs_before = [x[perm] for x in xs]
    records = []
    for path in PATHS:
        calls = {
            "inside": (lambda x, p=path: inside.matmul(x, path=p), [(x,) for x in xs]),
            "before": (lambda x, p=path: before.matmul(x, path=p), [(x,) for x in xs_before]),
            "by hand": (lambda x, p=path: before.matmul(x[perm], path=p)[position], [(x,) for x in xs]),
        }
        permuted = before.matmul(xs_before[0], path=path).double()  # Y's rows in the permuted order
        for label in ("inside", "by hand"):
            call, args = calls[label]
            error = (call(*args[0])[perm].double() - permuted).norm() / permuted.norm()
            if not error < 2e-2:  # TF32 and 16-bit products differ by their summation order only
                raise RuntimeError(f"{path}, {label}: relative error {float(error):.2e} against the permuted matrix")
        batches = {label: batch_for(call, args) for label, (call, args) in calls.items()}
        samples = {label: [] for label in calls}
        for _ in range(ROUNDS):
            for label, (call, args) in calls.items():
                samples[label].append(time_cuda(call, args, reps=5, batch=batches[label]))
        ms = {label: statistics.median(values) for label, values in samples.items()}
        records.append({"path": path, "inside_ms": ms["inside"], "before_ms": ms["before"], "by_hand_ms": ms["by hand"]})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="rmat18,sbm_132k_shuffled,ogbl_ddi,gg_amazon_cs,snap_ca-HepPh",
                        help="comma list of names, 'real', 'synthetic', or 'all' (benchmarks/reorder.py's graphs)")
    parser.add_argument("--method", default="tca", help="the reordering whose permutation is timed")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else ./out)")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and kernels.available()):
        raise SystemExit("benchmarks/permutation.py times the CUDA kernels: it needs a GPU and the built extension")
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    torch.set_float32_matmul_precision("high")  # TF32, as benchmarks/spmm.py measures the kernels
    folder = out_dir(args.out)
    folder.mkdir(parents=True, exist_ok=True)

    rows = []
    for name, load in graph_table(args.graphs).items():
        row, col, num_nodes = load(device)
        perm = reorder(from_coo(row, col, None, num_nodes, num_nodes), args.method)
        inside, before, position = tensors(row, col, num_nodes, perm, dtype)
        windows = inside._structure.layout.window_offsets, before._structure.layout.window_offsets
        if not torch.equal(*windows):
            raise RuntimeError(f"{name}: the blocks per window differ with the permutation inside and permuted before")
        for record in compare(inside, before, perm, position, args.n, dtype):
            record = {"graph": name, "nnz": row.numel(), "blocks": inside.stats()["tc_blocks"], **record}
            rows.append(record)
            print(format_row(record), flush=True)
        del inside, before, row, col
        torch.cuda.empty_cache()

    write_csv(folder / "permutation.csv", rows)
    print(f"\n# permutation cost on {torch.cuda.get_device_name()}, {args.method} order, N={args.n} {args.dtype}; "
          f"csv: {folder / 'permutation.csv'}")
    print(HEADER)
    for r in rows:
        print(format_row(r))


def format_row(r: dict) -> str:
    return (f"{r['graph']:<26} {r['nnz']:>11,} {r['path']:<9} {r['blocks']:>10,} {r['inside_ms']:>10.4f} "
            f"{r['before_ms']:>10.4f} {r['by_hand_ms']:>10.4f} {r['inside_ms'] / r['before_ms']:>13.3f} "
            f"{r['by_hand_ms'] / r['before_ms']:>14.3f}")


if __name__ == "__main__":
    main()
