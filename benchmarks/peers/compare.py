"""Our SpMM against RoDe (PPoPP'24; ``benchmarks/peers/rode.py``) on the corpus's graphs, float32
with TF32 off (RoDe's kernels are exact fp32, and ours then run exact too), every (graph, N)
guarded so that one failing case does not end the table.

Per graph (generated on the GPU by ``graph_data.corpus``; default: the "unseen" families at the
"large" tier) and N: the float64 reference (cuSPARSE on the float64 matrix and X), then ours,
cuSPARSE and RoDe, each output checked against it (relative Frobenius error, at most
--max-error) before it is timed. "ours" is the product as a user calls it (``A @ X``: the path
the library chooses, its routing included); our engine paths (--paths) are timed too, and the
fastest of them named. Times are CUDA-event medians of --reps samples after a warm-up, X rotated
through copies that overflow L2 (``benchmarks.common.time_cuda``); RoDe's zeroing of Y is in its
time. over_rode is RoDe's time over ours: above 1, ours is faster.

Guarding. RoDe has returned wrong sums, and has faulted: an illegal address ends the process's
CUDA context, after which every call in it fails. The cases run in a worker process that writes
a line before and after each step (a graph's build, our products, RoDe's), watched by this one:
a worker that dies, or writes nothing for --stall seconds, is ended; the step it was in is
recorded as failed with the last lines of its error output, and a new worker resumes after it.
A wrong output of RoDe is recorded and not timed. A product past RoDe's 32-bit offsets (X over
2 GiB; ``rode.out_of_range``) is not run: RoDe would read outside X. --rode-past-range runs it
anyway, to see what RoDe returns there.

Writes rode_compare.csv (a row per graph and N) and rode_compare_summary.csv (per split and N:
cases compared, geomean, worst and best of over_rode, cases ahead, RoDe's cases not compared by
reason) into --out (default $OUT, else ./out), rewritten as cases complete; the workers' error
output goes to rode_compare_worker.log there. Prints one table and the summary.

    python -m benchmarks.peers.compare --no-real              # unseen families, 16M and 64M
    python -m benchmarks.peers.compare --no-real --quick      # the 16M graphs, fewer samples
    python -m benchmarks.peers.compare --corpus all --tier medium --n 32,128
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import add_corpus_arguments, batch_for, geomean, out_dir, rotation_count, time_cuda, write_csv
from graph_data import corpus

ROOT = Path(__file__).resolve().parents[2]
PATHS = "rows,base,balanced,grouped"
# A graph of fewer nonzeros is timed over back-to-back calls per sample (as benchmarks.spmm
# does), so that small graphs compare throughput rather than launch jitter.
LARGE_NNZ = 1_000_000
# Columns of X per float64 reference product: bounds the reference's temporaries on graphs of
# tens of millions of rows.
REFERENCE_CHUNK = 32
FIELDS = ("graph", "family", "split", "rows", "cols", "nnz", "N", "x_gib", "ours_ms", "ours_path", "ours_err",
          "fastest_ms", "fastest_path", "rows_ms", "base_ms", "balanced_ms", "grouped_ms", "grouped_selectable",
          "cusparse_ms", "cusparse_err", "rode_ms", "rode_err", "rode_status", "rode_note", "over_rode",
          "fastest_over_rode", "over_cusparse", "ours_status", "ours_note")
SUMMARY_FIELDS = ("split", "N", "cases", "compared", "geomean_over_rode", "worst_over_rode", "worst_graph",
                  "best_over_rode", "ahead", "geomean_fastest_over_rode", "rode_out_of_range", "rode_wrong",
                  "rode_failed", "rode_unavailable", "ours_not_ok")
# RoDe's statuses: "ok" (checked and timed), "wrong" (checked, not timed), "out of range" (not
# run), "unavailable" (no module), "error" (raised), "crashed" and "stalled" (its worker died or
# hung in RoDe's step), "not run" (an earlier step of the case failed).
FAILED = ("error", "crashed", "stalled")
NAN = float("nan")
# Where the cases run: the GPU; the CPU tests run the worker's bookkeeping on the CPU.
DEVICE = "cuda"


def synchronize() -> None:
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()


# The worker: runs cases in this process and reports each step on the events file.

class Events:
    """JSON lines appended to a file, each flushed at once: what a worker wrote survives it."""

    def __init__(self, path: Path):
        self.handle = open(path, "a", buffering=1)

    def __call__(self, kind: str, **fields) -> None:
        self.handle.write(json.dumps({"event": kind, **fields}) + "\n")
        self.handle.flush()


class Reference:
    """A @ X in float64 (cuSPARSE on the float64 matrix and X), by column chunks, kept while it
    fits in a quarter of the free memory and recomputed at each check otherwise; ``error(y)`` is
    ||y - AX|| / ||AX||, NaN in y giving NaN."""

    def __init__(self, a64: torch.Tensor, x: torch.Tensor):
        self.a64, self.x = a64, x
        n = x.shape[1]
        self.spans = [(c, min(c + REFERENCE_CHUNK, n)) for c in range(0, n, REFERENCE_CHUNK)]
        free = torch.cuda.mem_get_info()[0] if x.is_cuda else 1 << 34
        keep = a64.shape[0] * n * 8 <= free // 4
        self.kept = [self._chunk(*span) for span in self.spans] if keep else None
        squares = 0.0
        for i, span in enumerate(self.spans):
            squares += float(self._reference(i).pow(2).sum())
        self.norm = math.sqrt(squares)

    def _chunk(self, start: int, end: int) -> torch.Tensor:
        return torch.sparse.mm(self.a64, self.x[:, start:end].double().contiguous())

    def _reference(self, i: int) -> torch.Tensor:
        return self.kept[i] if self.kept is not None else self._chunk(*self.spans[i])

    def error(self, y: torch.Tensor) -> float:
        squares = 0.0
        for i, (start, end) in enumerate(self.spans):
            squares += float((y[:, start:end].double() - self._reference(i)).pow(2).sum())
        return math.sqrt(squares) / max(self.norm, 1e-300)


def context_broken() -> bool:
    """Whether the process's CUDA context has a sticky error (an illegal address, say): then
    every later call fails, and the worker must end for a new one to go on."""
    try:
        synchronize()
        return float((torch.ones(1, device=DEVICE) + 1).item()) != 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True


def short(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def entries_of(args) -> dict:
    """name -> corpus entry of the graphs the options select, smaller sizes first."""
    chosen = []
    sizes = corpus.TIERS[args.tier][:1] if args.quick else corpus.TIERS[args.tier]
    wanted = [w for w in args.graphs.split(",") if w]
    skipped = [s for s in args.skip.split(",") if s]
    for entry in corpus.entries(args.corpus, args.tier, real=not args.no_real, seed=args.corpus_seed):
        if entry.nnz_target is not None and entry.nnz_target not in sizes:
            continue
        if (wanted and not any(w in entry.name for w in wanted)) or any(s in entry.name for s in skipped):
            continue
        chosen.append(entry)
    # Smaller graphs first: a run cut short has its smaller size complete.
    chosen.sort(key=lambda e: e.nnz_target or 0)
    return {entry.name: entry for entry in chosen}


def load_case_graph(entry, args, rode_module):
    """The graph of ``entry`` on the GPU: its CSR, our matrix, the float32 and float64 torch CSR
    matrices and the RoDe operator (None without RoDe)."""
    from torch_tcsparse import TCSparseTensor
    from torch_tcsparse.formats.csr import from_coo

    loaded = entry.load(DEVICE)
    row, col, shape = loaded
    num_rows, num_cols = shape if isinstance(shape, tuple) else (shape, shape)
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    values = torch.rand(row.numel(), device=DEVICE, generator=gen) + 0.5
    csr = from_coo(row, col, values, num_rows, num_cols)
    del row, col, values, loaded
    matrix = TCSparseTensor.from_csr(csr.rowptr, csr.col, csr.values, (num_rows, num_cols), reorder=args.reorder)
    a32 = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values, (num_rows, num_cols))
    a64 = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values.double(), (num_rows, num_cols))
    rode_op = (rode_module.RoDe(csr.rowptr, csr.col, csr.values, num_cols, past_range=args.rode_past_range)
               if rode_module is not None else None)
    return csr, matrix, a32, a64, rode_op


def run_ours(matrix, a32, reference, xs, n, args) -> dict:
    """Our product as called (A @ X) and each engine path of --paths, and cuSPARSE: error, time."""
    from torch_tcsparse.product import launcher

    nnz = matrix.nnz

    def timed(fn):
        batch = batch_for(fn, xs) if nnz < LARGE_NNZ else 1
        return time_cuda(fn, xs, reps=args.reps, batch=batch)

    out, notes = {}, []
    y = matrix @ xs[0][0]
    out["ours_err"] = reference.error(y)
    del y
    selection = matrix._structure.selection
    out["ours_path"] = selection.settled(n, torch.float32, xs[0][0].device) or matrix.explain(n).choice
    out["ours_ms"] = timed(lambda x: matrix @ x)
    grouped_selectable = matrix._structure.grouped_size() is not None
    out["grouped_selectable"] = grouped_selectable
    candidates = {}
    for path in [p for p in args.paths.split(",") if p]:
        try:
            run = launcher(matrix, path)
            error = reference.error(run(xs[0][0]))
            if not error <= args.max_error:
                notes.append(f"{path} wrong (error {error:.1e})")
                out[f"{path}_ms"] = NAN
                continue
            out[f"{path}_ms"] = timed(run)
            if path != "grouped" or grouped_selectable:
                candidates[path] = out[f"{path}_ms"]
        except Exception as error:  # noqa: BLE001 - recorded; a broken context ends the worker
            notes.append(f"{path}: {short(error)}")
            out[f"{path}_ms"] = NAN
            if context_broken():
                raise
    if candidates:
        out["fastest_path"] = min(candidates, key=candidates.get)
        out["fastest_ms"] = candidates[out["fastest_path"]]
    out["cusparse_err"] = reference.error(torch.sparse.mm(a32, xs[0][0]))
    out["cusparse_ms"] = timed(lambda x: torch.sparse.mm(a32, x))
    out["ours_status"] = "ok" if out["ours_err"] <= args.max_error else "wrong"
    out["ours_note"] = "; ".join(notes)
    return out


def run_rode(rode_op, unavailable, reference, xs, n, args) -> dict:
    """RoDe's product: refused where out of its range, checked, then timed and checked again."""
    from benchmarks.peers.rode import out_of_range

    if rode_op is None:
        return {"rode_status": "unavailable", "rode_note": unavailable}
    refusal = rode_op.refusal(n)
    if refusal:
        return {"rode_status": "out of range", "rode_note": refusal}
    past = " (past its range, --rode-past-range)" if out_of_range(rode_op.num_rows, rode_op.num_cols, n) else ""
    y = rode_op(xs[0][0])
    synchronize()
    error = reference.error(y)
    if not error <= args.max_error:
        return {"rode_status": "wrong", "rode_err": error, "rode_note": f"error {error:.1e} before timing{past}"}
    batch = batch_for(rode_op, xs) if rode_op.rowptr[-1].item() < LARGE_NNZ else 1
    ms = time_cuda(rode_op, xs, reps=args.reps, batch=batch)
    # Again after the timed calls: a race would show in some calls only.
    after = reference.error(rode_op(xs[0][0]))
    if not after <= args.max_error:
        return {"rode_status": "wrong", "rode_err": after, "rode_note": f"error {after:.1e} after timing{past}"}
    return {"rode_status": "ok", "rode_ms": ms, "rode_err": max(error, after), "rode_note": past.strip()}


def worker(args, work_path: Path) -> None:
    """Run the cases of the work file (graph name -> Ns), reporting each step on its events file;
    a fault that breaks the CUDA context ends the process once reported."""
    import faulthandler
    import warnings

    # A fatal signal leaves its traceback in the error output the supervisor quotes; torch's
    # notes on sparse CSR tensors would bury it.
    faulthandler.enable()
    warnings.filterwarnings("ignore", message="Sparse (invariant checks|CSR tensor support)")
    work = json.loads(work_path.read_text())
    emit = Events(Path(work["events"]))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    from torch_tcsparse import kernels

    on_gpu = torch.device(DEVICE).type == "cuda"
    if on_gpu and not kernels.available():
        raise SystemExit("needs a CUDA device and a working build of the kernels")
    from benchmarks.peers import rode

    unavailable = "--no-rode" if args.no_rode else rode.unavailable()
    rode_module = None
    if unavailable is None:
        try:
            rode.extension()
            rode_module = rode
        except Exception as error:  # noqa: BLE001 - the comparison runs without RoDe, saying why
            unavailable = short(error)
    prebuilt = rode.prebuilt_problem() is None
    emit("worker", device=torch.cuda.get_device_name() if on_gpu else DEVICE, torch=torch.__version__,
         tf32=kernels.tf32_allowed(), rode=unavailable or ("prebuilt module" if prebuilt else "built from the clone"))
    entries = entries_of(args)

    def fatal(what: str):
        print(f"  worker: {what}; the CUDA context is broken, a new worker goes on", flush=True)
        os._exit(3)

    for name, ns in work["work"]:
        entry = entries[name]
        emit("start", step="graph", graph=name, N=None)
        try:
            csr, matrix, a32, a64, rode_op = load_case_graph(entry, args, rode_module)
        except Exception as error:  # noqa: BLE001
            emit("graph", graph=name, status="error", note=short(error))
            if context_broken():
                fatal(short(error))
            continue
        emit("graph", graph=name, status="ok", family=entry.family, split=entry.split, rows=csr.num_rows,
             cols=csr.num_cols, nnz=csr.nnz)
        for n in ns:
            xs = reference = None  # the last N's X and reference go before this N's are made
            emit("start", step="ours", graph=name, N=n)
            try:
                count = rotation_count(csr.num_cols * n * 4)
                xs = [(torch.randn(csr.num_cols, n, device=DEVICE),) for _ in range(count)]
                reference = Reference(a64, xs[0][0])
                ours = run_ours(matrix, a32, reference, xs, n, args)
            except Exception as error:  # noqa: BLE001
                emit("ours", graph=name, N=n, ours_status="error", ours_note=short(error))
                emit("rode", graph=name, N=n, rode_status="not run", rode_note="our step failed")
                if context_broken():
                    fatal(short(error))
                continue
            emit("ours", graph=name, N=n, **ours)
            emit("start", step="rode", graph=name, N=n)
            try:
                result = run_rode(rode_op, unavailable, reference, xs, n, args)
            except Exception as error:  # noqa: BLE001
                result = {"rode_status": "error", "rode_note": short(error)}
            emit("rode", graph=name, N=n, **result)
            rode_ms = result.get("rode_ms", NAN)
            print(f"  {name:<18}{entry.split:>7}{n:>5}  ours {ours['ours_ms']:8.3f} ms ({ours['ours_path']})"
                  f"  RoDe {rode_ms:8.3f} ms  x RoDe {rode_ms / ours['ours_ms']:5.2f}  {result['rode_status']}",
                  flush=True)
            if result["rode_status"] == "error" and context_broken():
                fatal(result["rode_note"])
            del xs, reference
        del csr, matrix, a32, a64, rode_op
        if on_gpu:
            torch.cuda.empty_cache()
    emit("done")


# The supervisor: runs workers over the plan, records what each step gave or how it failed.

class Table:
    """The cases' records, built from the workers' events."""

    def __init__(self, plan, meta: dict):
        self.plan = plan
        self.meta = meta
        self.graphs = {}
        self.records = {}
        self.done = set()
        self.step = None
        self.worker = {}

    def record(self, graph: str, n: int) -> dict:
        if (graph, n) not in self.records:
            info = {**self.meta.get(graph, {}), **self.graphs.get(graph, {})}
            cols = info.get("cols")
            self.records[(graph, n)] = {
                "graph": graph, "family": info.get("family", ""), "split": info.get("split", ""),
                "rows": info.get("rows", ""), "cols": cols if cols is not None else "", "nnz": info.get("nnz", ""),
                "N": n, "x_gib": round(cols * n * 4 / 2**30, 3) if cols else NAN}
        return self.records[(graph, n)]

    def apply(self, event: dict) -> None:
        kind = event.pop("event")
        if kind == "worker":
            self.worker = event
        elif kind == "start":
            self.step = event
        elif kind == "graph":
            graph = event.pop("graph")
            self.graphs[graph] = event
            self.step = None
            if event["status"] != "ok":
                for n in self.ns(graph):
                    self.fail(graph, n, "ours", "error", f"graph: {event['note']}")
        elif kind == "ours":
            self.record(event.pop("graph"), event.pop("N")).update(event)
            self.step = None
        elif kind == "rode":
            graph, n = event.pop("graph"), event.pop("N")
            self.record(graph, n).update(event)
            self.done.add((graph, n))
            self.step = None

    def ns(self, graph: str) -> list:
        return next(ns for name, ns in self.plan if name == graph)

    def fail(self, graph: str, n: int, step: str, status: str, note: str) -> None:
        record = self.record(graph, n)
        if step == "rode":
            record.update(rode_status=status, rode_note=note)
        else:
            record.update(ours_status=status, ours_note=note, rode_status="not run", rode_note=f"our step {status}")
        self.done.add((graph, n))

    def fail_step(self, status: str, note: str) -> None:
        """The step a worker was in when it died or hung: failed, with every case it covered."""
        step, self.step = self.step, None
        if step is None:
            return
        graph = step["graph"]
        if step["step"] == "graph":
            for n in self.ns(graph):
                self.fail(graph, n, "ours", status, f"graph: {note}")
        else:
            self.fail(graph, step["N"], step["step"], status, note)

    def remaining(self) -> list:
        out = []
        for graph, ns in self.plan:
            left = [n for n in ns if (graph, n) not in self.done]
            if left:
                out.append([graph, left])
        return out

    def rows(self) -> list[dict]:
        out = []
        for graph, ns in self.plan:
            for n in ns:
                if (graph, n) in self.records:
                    out.append(finish(dict(self.records[(graph, n)])))
        return out


def finish(record: dict) -> dict:
    """A case's record with its ratios and every field present."""
    rode_ms = record.get("rode_ms", NAN) if record.get("rode_status") == "ok" else NAN
    record["rode_ms"] = rode_ms
    ours_ms, fastest_ms = record.get("ours_ms", NAN), record.get("fastest_ms", NAN)
    record["over_rode"] = rode_ms / ours_ms if ours_ms == ours_ms and ours_ms > 0 else NAN
    record["fastest_over_rode"] = rode_ms / fastest_ms if fastest_ms == fastest_ms and fastest_ms > 0 else NAN
    cusparse_ms = record.get("cusparse_ms", NAN)
    record["over_cusparse"] = cusparse_ms / ours_ms if ours_ms == ours_ms and ours_ms > 0 else NAN
    return {field: record.get(field, NAN if field.endswith(("_ms", "_err")) else "") for field in FIELDS}


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])[-400:]


def supervise(plan, meta: dict, command, folder: Path, stall_s: float, on_progress=None) -> Table:
    """Run ``command + ["--worker", WORK_FILE]`` until every case of ``plan`` ([graph, [N...]]) is
    done or failed; a worker that dies or writes nothing for ``stall_s`` seconds is ended, the
    step it was in recorded as failed, and a new one started on the cases left. ``meta``: graph
    -> its family and split."""
    table = Table(plan, meta)
    events_path = folder / "rode_compare_events.jsonl"
    log_path = folder / "rode_compare_worker.log"
    work_path = folder / "rode_compare_work.json"
    events_path.write_text("")
    log_path.write_text("")
    offset = 0
    while table.remaining():
        before = len(table.done)
        work_path.write_text(json.dumps({"events": str(events_path), "work": table.remaining()}))
        with open(log_path, "a") as log:
            process = subprocess.Popen([*command, "--worker", str(work_path)], cwd=ROOT, stderr=log)
        last = time.monotonic()
        stalled = False
        while True:
            finished = process.poll() is not None
            with open(events_path) as handle:
                handle.seek(offset)
                chunk = handle.read()
            complete = chunk[:chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                table.apply(json.loads(line))
                last = time.monotonic()
                if on_progress is not None:
                    on_progress(table)
            if finished:
                break
            if time.monotonic() - last > stall_s:
                process.kill()
                process.wait()
                stalled = True
                break
            time.sleep(0.2)
        code = process.returncode
        if table.remaining() and (code != 0 or stalled or table.step is not None):
            how = (f"stalled: no report for {stall_s:.0f} s" if stalled
                   else f"crashed: worker exit {code}" if code != 3 else "crashed: CUDA context broken")
            table.fail_step("stalled" if stalled else "crashed", f"{how}; {log_tail(log_path)}")
        elif table.remaining() and code == 0:
            raise SystemExit(f"a worker ended without running {table.remaining()}")
        if len(table.done) == before:
            raise SystemExit(f"a worker made no progress (exit {code}); its error output ends: {log_tail(log_path, 12)}")
        if on_progress is not None:
            on_progress(table)
    return table


# Summary and output.

def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for split in ("fit", "unseen"):
        part = [r for r in rows if r["split"] == split]
        for n in [*sorted({r["N"] for r in part}), "all"]:
            cases = [r for r in part if n == "all" or r["N"] == n]
            if not cases:
                continue
            compared = [r for r in cases if r["rode_status"] == "ok" and r["over_rode"] == r["over_rode"]]
            worst = min(compared, key=lambda r: r["over_rode"], default=None)
            out.append({
                "split": split, "N": n, "cases": len(cases), "compared": len(compared),
                "geomean_over_rode": geomean([r["over_rode"] for r in compared]),
                "worst_over_rode": worst["over_rode"] if worst else NAN,
                "worst_graph": f"{worst['graph']} N={worst['N']}" if worst else "",
                "best_over_rode": max((r["over_rode"] for r in compared), default=NAN),
                "ahead": sum(r["over_rode"] > 1 for r in compared),
                "geomean_fastest_over_rode": geomean([r["fastest_over_rode"] for r in compared]),
                "rode_out_of_range": sum(r["rode_status"] == "out of range" for r in cases),
                "rode_wrong": sum(r["rode_status"] == "wrong" for r in cases),
                "rode_failed": sum(r["rode_status"] in FAILED for r in cases),
                "rode_unavailable": sum(r["rode_status"] == "unavailable" for r in cases),
                "ours_not_ok": sum(r["ours_status"] != "ok" for r in cases),
            })
    return out


def write_outputs(rows: list[dict], folder: Path) -> None:
    write_csv(folder / "rode_compare.csv", rows, FIELDS)
    write_csv(folder / "rode_compare_summary.csv", summarize(rows), SUMMARY_FIELDS)


def print_table(rows: list[dict], worker: dict, reps: int) -> None:
    print(f"\nours (A @ X) against RoDe, float32, TF32 {'on' if worker.get('tf32') else 'off'}, on "
          f"{worker.get('device', '?')} (torch {worker.get('torch', '?')}; RoDe: {worker.get('rode', '?')}): "
          f"CUDA-event medians of {reps}, ms; x RoDe = RoDe's time / ours (above 1: ours faster)")
    print(f"{'graph':<18}{'split':>7}{'nnz':>10}{'N':>5}{'X GiB':>7}{'ours ms':>9} {'(path)':<11}{'fastest':>9} "
          f"{'(path)':<11}{'cuSP':>9}{'RoDe':>9}{'x RoDe':>8}  RoDe status")
    for r in rows:
        # The X column says why a case is out of range; a failure's note is cut to its start.
        note = r["rode_note"] if r["rode_status"] not in ("ok", "out of range") else ""
        status = r["rode_status"] + (f": {note[:70]}" if note else "")
        if r["ours_status"] != "ok":
            status = f"ours {r['ours_status']}: {r['ours_note'][:60]}; RoDe {status}"
        print(f"{r['graph'][:17]:<18}{r['split']:>7}{r['nnz']!s:>10}{r['N']:>5}{r['x_gib']:>7.2f}{r['ours_ms']:>9.3f} "
              f"{'(' + str(r['ours_path']) + ')':<11}{r['fastest_ms']:>9.3f} {'(' + str(r['fastest_path']) + ')':<11}"
              f"{r['cusparse_ms']:>9.3f}{r['rode_ms']:>9.3f}{r['over_rode']:>8.2f}  {status}")
    print("\nper split and N: geomean of x RoDe over the cases compared (RoDe checked and timed), worst, cases "
          "ahead; the fastest of our paths' geomean; RoDe's cases not compared")
    for s in summarize(rows):
        print(f"{s['split']:>7} N={s['N']!s:<4} x RoDe {s['geomean_over_rode']:5.2f} over {s['compared']}/{s['cases']}"
              f" (worst {s['worst_over_rode']:.2f} {s['worst_graph']}, best {s['best_over_rode']:.2f}, ahead on "
              f"{s['ahead']}/{s['compared']}), fastest path {s['geomean_fastest_over_rode']:.2f}; RoDe out of range "
              f"{s['rode_out_of_range']}, wrong {s['rode_wrong']}, failed {s['rode_failed']}"
              + (f", unavailable {s['rode_unavailable']}" if s["rode_unavailable"] else "")
              + (f"; ours not ok {s['ours_not_ok']}" if s["ours_not_ok"] else ""))


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="", help="comma-separated substrings of graph names (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated substrings of graph names to leave out")
    parser.add_argument("--n", default="32,64,128,256")
    parser.add_argument("--reps", type=int, default=None, help="timed samples per product (default 20, --quick 8)")
    parser.add_argument("--quick", action="store_true", help="the tier's smaller graphs only, 8 samples")
    parser.add_argument("--paths", default=PATHS, help=f"our engine paths timed besides A @ X (default {PATHS})")
    parser.add_argument("--reorder", default="none", help="our matrix's reordering (RoDe runs on the graph as given)")
    parser.add_argument("--max-error", type=float, default=1e-5,
                        help="relative error against float64 allowed (fp32 sums in another order)")
    parser.add_argument("--no-rode", action="store_true", help="time ours alone")
    parser.add_argument("--rode-past-range", action="store_true",
                        help="run RoDe past its 32-bit offsets too (expect wrong results or a fault)")
    parser.add_argument("--stall", type=float, default=180.0, help="seconds without a report before a worker is ended")
    parser.add_argument("--in-process", action="store_true", help="run the cases here, without a worker (unguarded)")
    parser.add_argument("--list", action="store_true", help="print the graphs and Ns the options select, and exit")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    add_corpus_arguments(parser)
    parser.set_defaults(corpus="unseen", tier="large")
    return parser


def parse(argv=None):
    args = parser_of().parse_args(argv)
    if args.reps is None:
        args.reps = 8 if args.quick else 20
    args.ns = [int(n) for n in args.n.split(",") if n]
    if not args.ns or any(n <= 0 for n in args.ns):
        raise SystemExit(f"--n must list positive widths, got {args.n!r}")
    if args.corpus is None:
        raise SystemExit("--corpus must name fit, unseen or all")
    return args


def follow_parent() -> None:
    """A worker ends with its supervisor (Linux's parent-death signal): a run cut short by a time
    limit leaves no worker holding the GPU."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        follow_parent()
        return worker(args, Path(args.worker))
    entries = entries_of(args)
    plan = [[name, list(args.ns)] for name in entries]
    meta = {name: {"family": e.family, "split": e.split} for name, e in entries.items()}
    if args.list or not plan:
        for name, ns in plan:
            print(f"{name}  N={','.join(map(str, ns))}")
        if not plan:
            print("no graph selected")
        return plan
    folder = out_dir(args.out)
    start = time.perf_counter()
    print(f"{len(plan)} graphs x {len(args.ns)} N, float32, TF32 off; csv: {folder / 'rode_compare.csv'}", flush=True)
    if args.in_process:
        command = None
        work_path = folder / "rode_compare_work.json"
        events_path = folder / "rode_compare_events.jsonl"
        events_path.write_text("")
        work_path.write_text(json.dumps({"events": str(events_path), "work": plan}))
        worker(args, work_path)
        table = Table(plan, meta)
        for line in events_path.read_text().splitlines():
            table.apply(json.loads(line))
    else:
        command = [sys.executable, "-m", "benchmarks.peers.compare", *argv]
        table = supervise(plan, meta, command, folder, args.stall, lambda t: write_outputs(t.rows(), folder))
    rows = table.rows()
    write_outputs(rows, folder)
    print_table(rows, table.worker, args.reps)
    print(f"\n{len(rows)} cases in {time.perf_counter() - start:.0f} s; {folder / 'rode_compare.csv'}, "
          f"{folder / 'rode_compare_summary.csv'}")
    return rows


if __name__ == "__main__":
    main()
