"""The rows kernel (``engines/rows.py``) against its floors, cuSPARSE, another checkout's rows
kernel and RoDe, on large generated graphs of the corpus's families, at every N and dtype.

For each graph, N and dtype: our rows kernel on the CSR as given (pieces sized as the "rows" path
sizes them), the same kernel of ``--baseline`` (a directory holding another checkout: its
``torch_tcsparse/csrc`` rows kernel and binding are built alone, into a module of their own),
cuSPARSE (``torch.sparse.mm``, CSR) and, with ``--peers rode``, RoDe in float32; each checked
against cuSPARSE's float32 product of the same (rounded) operands, then timed as CUDA-event
medians with rotated X. Both floors come at the copy bandwidth measured in the same process: the
compulsory one (the CSR, X and Y once) and the no-reuse gather floor (the CSR once, a row of X per
nonzero, Y once). Prints one row per case, then a short table: per dtype and N, the rows kernel's
time over the gather floor (geomean and worst), its speedup over the baseline and over cuSPARSE.
Writes rows.csv into --out.

    python -m benchmarks.rows --baseline .devdata/baseline
    python -m benchmarks.rows --families uniform,road --nnz 4000000 --n 32,128 --dtypes float16
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks.common import (copy_bandwidth, floors_ms, geomean, out_dir, rotation_count, time_cuda, write_csv)
from graph_data import corpus
from torch_tcsparse import csr_rows, kernels
from torch_tcsparse.formats.csr import from_coo

# Families without structure that ids hide (uniform, power law, road-like low degree, a sampled
# block's uniform rows) and two with hubs or a rectangular shape, of both splits.
FAMILIES = "uniform,road,kron,powerlaw,sampled,bipartite"
BASELINE_MODULE = """#include <torch/extension.h>
#include "kernel_bindings.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("csr_rows_spmm", &tcsparse_binding::csr_rows_spmm); }
"""


def baseline_kernel(checkout: Path, build_root: Path):
    """The rows kernel of another checkout, built alone with our build flags into a folder of
    ``build_root`` (a few tens of seconds, where its whole library would take minutes): its
    ``csr_rows_spmm`` binding."""
    from torch.utils import cpp_extension

    from torch_tcsparse._build_config import CXX_FLAGS, NVCC_FLAGS, arch_list, gencode_flags

    csrc = (checkout / "torch_tcsparse" / "csrc").resolve()
    build = build_root / "rows-baseline"
    build.mkdir(parents=True, exist_ok=True)
    module = build / "rows_baseline_module.cpp"
    module.write_text(BASELINE_MODULE)
    return cpp_extension.load(
        name="tcsparse_rows_baseline",
        sources=[str(module), *(str(csrc / s) for s in ("csr_rows_binding.cpp", "split_sums.cpp", "csr_rows_spmm.cu"))],
        extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=[*NVCC_FLAGS, *gencode_flags(arch_list())],
        extra_include_paths=[str(csrc)], build_directory=str(build), is_python_module=True)


def load_graph(family: str, nnz: int, seed: int):
    row, col, shape = corpus.generate(family, nnz, seed=seed, device="cuda")
    num_rows, num_cols = shape if isinstance(shape, tuple) else (shape, shape)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    values = torch.rand(row.numel(), device="cuda", generator=gen) + 0.5
    return from_coo(row, col, values, num_rows, num_cols)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-30))


def bench_graph(name, split, csr, ns, dtypes, args, bandwidth, baseline, rode):
    out = []
    degree = csr.rowptr[1:] - csr.rowptr[:-1]
    max_row = int(degree.max())
    matrix32 = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values, (csr.num_rows, csr.num_cols))
    rode_op = rode(csr.rowptr, csr.col, csr.values, csr.num_cols) if rode else None
    for dtype in dtypes:
        element = dtype.itemsize
        values = csr.values.to(dtype)
        matrix = torch.sparse_csr_tensor(csr.rowptr, csr.col, values, (csr.num_rows, csr.num_cols))
        exact = torch.sparse_csr_tensor(csr.rowptr, csr.col, values.float(), (csr.num_rows, csr.num_cols))
        pieces = csr_rows.row_pieces(csr.rowptr, csr_rows.split_piece_nnz(csr.nnz, max_row, dtype), max_row)
        paths = {"rows": lambda x: kernels.csr_rows_spmm(x, csr.rowptr, csr.col, values, pieces, csr.num_cols),
                 "cusparse": lambda x: torch.sparse.mm(matrix, x)}
        if baseline is not None:
            paths["baseline"] = lambda x: baseline.csr_rows_spmm(
                x, csr.rowptr, csr.col, values, pieces.piece_slots, pieces.piece_starts, pieces.split_rows,
                csr.num_cols, pieces.piece_nnz, None, None, None)
        for n in ns:
            x_bytes = csr.num_cols * n * element
            xs = [(torch.randn(csr.num_cols, n, device="cuda").to(dtype),) for _ in range(rotation_count(x_bytes))]
            expected = torch.sparse.mm(exact, xs[0][0].float())
            # float32: the same fp32 sums in another order; 16 bits: one rounding of the output.
            tolerance = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
            times, errors = {}, {}
            for path, run in paths.items():
                errors[path] = relative_error(run(xs[0][0]), expected)
                times[path] = time_cuda(run, xs, reps=args.reps)
            if rode_op is not None and dtype == torch.float32 and not rode_op.supports(n):
                print(f"  rode skipped on {name} N={n}: {rode_op.refusal(n)}", flush=True)
            elif rode_op is not None and dtype == torch.float32:
                errors["rode"] = relative_error(rode_op(xs[0][0]), torch.sparse.mm(matrix32, xs[0][0]))
                times["rode"] = time_cuda(rode_op, xs, reps=args.reps)
            for path, error in errors.items():
                if error > (1e-2 if path == "cusparse" else tolerance):
                    print(f"WRONG RESULT {path} {name} N={n} {dtype}: relative error {error:.2e}", flush=True)
            floor_ms, gather_ms = floors_ms(csr.num_rows, csr.nnz, x_bytes, n, element, bandwidth)
            nan = float("nan")
            record = {
                "graph": name, "split": split, "rows": csr.num_rows, "cols": csr.num_cols, "nnz": csr.nnz,
                "max_row": max_row, "N": n, "dtype": str(dtype).replace("torch.", ""),
                "piece_nnz": pieces.piece_nnz, "rows_ms": times["rows"], "baseline_ms": times.get("baseline", nan),
                "cusparse_ms": times["cusparse"], "rode_ms": times.get("rode", nan), "floor_ms": floor_ms,
                "gather_floor_ms": gather_ms, "rows_vs_gather": times["rows"] / gather_ms,
                "rows_vs_floor": times["rows"] / floor_ms,
                "over_baseline": times.get("baseline", nan) / times["rows"],
                "over_cusparse": times["cusparse"] / times["rows"], "over_rode": times.get("rode", nan) / times["rows"],
                "rows_err": errors["rows"], "baseline_err": errors.get("baseline", nan),
            }
            out.append(record)
            print(f"  {name:<16}{split:>7}{record['dtype']:>9}{n:>5}{times['rows']:>9.3f}{record['baseline_ms']:>9.3f}"
                  f"{times['cusparse']:>9.3f}{record['rode_ms']:>9.3f}{gather_ms:>9.3f}{floor_ms:>9.3f}"
                  f"{record['rows_vs_gather']:>7.2f}{record['over_baseline']:>7.2f}{record['over_cusparse']:>7.2f}"
                  f"{record['over_rode']:>7.2f}{errors['rows']:>9.1e}", flush=True)
            del xs, expected
    return out


def print_summary(records) -> None:
    print("\nrows kernel per dtype and N (geomeans over the graphs; worst case named): time over the no-reuse "
          "gather floor, over the compulsory floor, speedup over the baseline, cuSPARSE and RoDe")
    print(f"{'dtype':<10}{'N':>5}{'/gather':>9}{'worst':>8}  {'graph':<16}{'/floor':>8}{'x base':>8}{'worst':>8}"
          f"{'x cuSP':>8}{'x RoDe':>8}")
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        for n in sorted({r["N"] for r in records}):
            part = [r for r in records if r["dtype"] == dtype and r["N"] == n]
            if not part:
                continue
            worst = max(part, key=lambda r: r["rows_vs_gather"])
            base = [r["over_baseline"] for r in part if r["over_baseline"] == r["over_baseline"]]
            print(f"{dtype:<10}{n:>5}{geomean([r['rows_vs_gather'] for r in part]):>9.2f}{worst['rows_vs_gather']:>8.2f}  "
                  f"{worst['graph'][:15]:<16}{geomean([r['rows_vs_floor'] for r in part]):>8.2f}"
                  f"{geomean(base):>8.2f}{min(base, default=float('nan')):>8.2f}"
                  f"{geomean([r['over_cusparse'] for r in part]):>8.2f}{geomean([r['over_rode'] for r in part]):>8.2f}")
    for split in ("fit", "unseen"):
        part = [r for r in records if r["split"] == split]
        if part:
            print(f"{split}: {len(dict.fromkeys(r['graph'] for r in part))} graphs, rows kernel over the gather floor "
                  f"geomean {geomean([r['rows_vs_gather'] for r in part]):.2f}x, within 1.15x on "
                  f"{sum(r['rows_vs_gather'] <= 1.15 for r in part)}/{len(part)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=FAMILIES, help=f"comma list of graph_data.corpus families ({FAMILIES})")
    parser.add_argument("--nnz", type=int, default=16_000_000, help="about this many nonzeros per graph")
    parser.add_argument("--n", default="32,64,128,256")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", default="", help="a directory holding another checkout, whose rows kernel to time")
    parser.add_argument("--peers", default="", help="rode: time RoDe in float32 (benchmarks/peers/rode.py)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--build-only", action="store_true",
                        help="build the baseline's rows kernel and exit (to build it beside the library)")
    args = parser.parse_args(argv)
    folder = out_dir(args.out)
    start = time.perf_counter()
    baseline = None
    if args.baseline:
        baseline = baseline_kernel(Path(args.baseline), Path(os.environ.get("TCSPARSE_BUILD_DIR") or folder))
        print(f"baseline rows kernel from {args.baseline} built in {time.perf_counter() - start:.0f} s", flush=True)
    if args.build_only:
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    rode = None
    if "rode" in args.peers.split(","):
        from benchmarks.peers import rode as rode_peer

        reason = rode_peer.unavailable()
        print(f"peer rode skipped: {reason}" if reason else "peer rode: built from its local clone", flush=True)
        rode = None if reason else rode_peer.RoDe
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"  {'graph':<16}{'split':>7}{'dtype':>9}{'N':>5}{'rows':>9}{'base':>9}{'cuSP':>9}{'RoDe':>9}{'gather':>9}"
          f"{'floor':>9}{'/gath':>7}{'x base':>7}{'x cuSP':>7}{'x RoDe':>7}{'err':>9}")
    ns = [int(n) for n in args.n.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    records = []
    for family in args.families.split(","):
        csr = load_graph(family, args.nnz, args.seed)
        records += bench_graph(f"{family}_{csr.nnz // 1_000_000}M", corpus.split_of(family), csr, ns, dtypes, args,
                               bandwidth, baseline, rode)
        del csr
        torch.cuda.empty_cache()
        write_csv(folder / "rows.csv", records)
    print(f"\n{len(records)} cases in {time.perf_counter() - start:.0f} s; csv: {folder / 'rows.csv'}")
    print_summary(records)


if __name__ == "__main__":
    main()
