"""The RoDe peer without a GPU: its row decomposition against RoDe's own preprocessing rule, the
range of its 32-bit offsets, the record a prebuilt module must match, and the comparison's
worker and supervisor (benchmarks/peers/compare.py) run on the CPU with a stand-in for RoDe:
a wrong result is recorded and not timed, a fault or a hang of one case is recorded with the
step it hit and a new worker goes on with the cases after it."""
import csv
import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.peers import compare, rode

TINY = ["--tier", "small", "--no-real", "--graphs", "kron_20k,road_20k", "--n", "32,64", "--paths", "", "--reps", "2"]


def row_division(rowptr, segment=512, vector=4, block=32):
    """RoDe's RowDivide2Segment(512, 4, 32), step by step: a row's length counts the nonzeros
    back to its 4-aligned start; the first segment starts at the row, the next ones on the
    aligned boundaries after it; a rest of a 32-nonzero block or more is a segment too, and a
    rest that does not divide into blocks makes the row a residue row."""
    rows, starts, residue = [], [], []
    for i in range(len(rowptr) - 1):
        offset = rowptr[i]
        misalign = offset % vector
        length = rowptr[i + 1] - offset + misalign
        if length > segment:
            rows.append(i)
            starts.append(offset)
            offset += segment - misalign
            length -= segment
        while length > segment:
            rows.append(i)
            starts.append(offset)
            offset += segment
            length -= segment
        if length > 0:
            if length >= block:
                rows.append(i)
                starts.append(offset)
            if length % block:
                residue.append(i)
    return rows, starts + [rowptr[-1]], residue


def test_segments_follow_rodes_row_division():
    rng = random.Random(0)
    lengths = (0, 1, 3, 4, 5, 31, 32, 33, 63, 64, 100, 511, 512, 513, 516, 1024, 1025, 1030, 2000)
    for _ in range(200):
        rowptr = [0]
        for _ in range(rng.randint(1, 30)):
            rowptr.append(rowptr[-1] + rng.choice([*lengths, rng.randint(0, 3000)]))
        got = rode.segments(torch.tensor(rowptr))
        assert all(t.dtype == torch.int32 for t in got)
        assert [t.tolist() for t in got] == list(row_division(rowptr))


def test_the_range_of_rodes_offsets():
    # A row of X is at col * N * 4 bytes: the last column must stay within a 32-bit int.
    assert rode.out_of_range(10, 2**21, 256) is None
    assert "2 GiB" in rode.out_of_range(10, 2**21 + 1, 256)
    assert rode.out_of_range(10, 2**24, 32) is None and rode.out_of_range(10, 2**24 + 1, 32)
    assert rode.out_of_range(10, 8_000_000, 64) is None and rode.out_of_range(10, 8_000_000, 128)
    # Y by element offsets; widths of its kernels.
    assert "into Y" in rode.out_of_range(2**23 + 1, 10, 256)
    assert rode.out_of_range(10, 10, 96) and rode.out_of_range(10, 10, 16) and rode.out_of_range(10, 10, 192) is None


def test_gencode_flags():
    assert rode.gencode_flags("9.0") == ["-gencode=arch=compute_90,code=sm_90"]
    assert rode.gencode_flags("8.0;9.0+PTX") == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
                                                 "-gencode=arch=compute_90,code=compute_90"]
    with pytest.raises(ValueError):
        rode.gencode_flags("sm90")


def test_a_prebuilt_module_serves_only_the_torch_python_and_binding_it_was_built_for(tmp_path):
    assert "no prebuilt module" in rode.prebuilt_problem(tmp_path)
    (tmp_path / f"{rode.NAME}.so").write_bytes(b"")
    record = {**rode.runtime_record(), "arch": ["9.0"]}
    (tmp_path / f"{rode.NAME}.json").write_text(json.dumps(record))
    if not torch.cuda.is_available():
        assert rode.prebuilt_problem(tmp_path) is None
    for key in ("torch", "python", "binding"):
        (tmp_path / f"{rode.NAME}.json").write_text(json.dumps({**record, key: "other"}))
        assert f"built for {key} other" in rode.prebuilt_problem(tmp_path)
    assert len(rode.pinned_commit()) == 40


def test_the_plan_runs_smaller_graphs_first_and_quick_keeps_the_smaller_size():
    plan = compare.main(["--list", "--no-real"])
    names = [name for name, _ in plan]
    assert len(names) == 12 and all(n.endswith("_16M") for n in names[:6]) and all(n.endswith("_64M") for n in names[6:])
    assert {corpus_split for corpus_split in (compare.corpus.split_of(n.rsplit("_", 1)[0]) for n in names)} == {"unseen"}
    assert [name for name, _ in compare.main(["--list", "--no-real", "--quick"])] == names[:6]
    assert all(ns == [32, 64, 128, 256] for _, ns in plan)
    args = compare.parse(["--quick"])
    assert args.reps == 8 and compare.parse([]).reps == 20
    with pytest.raises(SystemExit):
        compare.parse(["--n", "0"])


class FakeRoDe:
    """RoDe's interface over torch.sparse.mm, with faults where FAKE_RODE_FAULTS says
    ("graph:N:kind" items; kinds: wrong, raise, fault, abort, hang). Its range is a quarter of
    the columns' count, so that the wider N of a tiny graph is out of range."""

    faults = {}

    def __init__(self, rowptr, col, values, num_cols=None, past_range=False):
        self.matrix = torch.sparse_csr_tensor(rowptr, col, values, (rowptr.numel() - 1, num_cols))
        self.num_rows, self.num_cols, self.past_range = rowptr.numel() - 1, num_cols, past_range
        self.rowptr = rowptr
        self.graph = FakeRoDe.current

    def refusal(self, n):
        return None if n <= 64 else f"N = {n} past the stand-in's range"

    def __call__(self, x):
        kind = self.faults.get((self.graph, x.shape[1]))
        if kind == "wrong":
            return torch.sparse.mm(self.matrix, x) + 1
        if kind == "raise":
            raise RuntimeError("RoDe's stand-in refuses")
        if kind == "fault":
            compare.context_broken = lambda: True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if kind == "abort":
            os.abort()
        if kind == "hang":
            import time

            time.sleep(600)
        return torch.sparse.mm(self.matrix, x)


def install_fakes():
    """The worker on the CPU: the graph, ours and the reference run there, timings are constants
    (RoDe's stand-in 2 ms, the rest 1 ms), RoDe's module is the stand-in."""
    compare.DEVICE = "cpu"
    compare.batch_for = lambda fn, xs: 1
    compare.rotation_count = lambda buffer_bytes: 2
    compare.time_cuda = lambda fn, xs, reps=20, batch=1: 2.0 if isinstance(fn, FakeRoDe) else 1.0
    compare.context_broken = lambda: False
    FakeRoDe.faults = {}
    for item in filter(None, os.environ.get("FAKE_RODE_FAULTS", "").split(",")):
        graph, n, kind = item.split(":")
        FakeRoDe.faults[(graph, int(n))] = kind
    FakeRoDe.current = None
    rode.unavailable = lambda: None
    rode.extension = lambda: None
    rode.RoDe = FakeRoDe
    load = compare.load_case_graph

    def load_and_name(entry, args, module):
        FakeRoDe.current = entry.name
        return load(entry, args, module)
    compare.load_case_graph = load_and_name


@pytest.fixture
def fakes(monkeypatch):
    for name in ("DEVICE", "batch_for", "rotation_count", "time_cuda", "context_broken", "load_case_graph"):
        monkeypatch.setattr(compare, name, getattr(compare, name))
    for name in ("unavailable", "extension", "RoDe"):
        monkeypatch.setattr(rode, name, getattr(rode, name))
    install_fakes()


def read(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def by_case(rows):
    return {(r["graph"], int(r["N"])): r for r in rows}


def test_the_worker_checks_times_and_refuses_in_one_process(fakes, tmp_path, monkeypatch):
    monkeypatch.setitem(FakeRoDe.faults, ("road_20k", 32), "wrong")
    monkeypatch.setitem(FakeRoDe.faults, ("kron_20k", 64), "raise")
    rows = compare.main([*TINY, "--n", "32,64,128", "--in-process", "--out", str(tmp_path)])
    cases = by_case(rows)
    assert set(cases) == {(g, n) for g in ("kron_20k", "road_20k") for n in (32, 64, 128)}
    ok = cases[("kron_20k", 32)]
    assert ok["rode_status"] == "ok" and ok["rode_ms"] == 2.0 and ok["over_rode"] == 2.0 and ok["ours_status"] == "ok"
    assert ok["ours_err"] < 1e-6 and ok["rode_err"] < 1e-6 and ok["split"] == "unseen" and ok["family"] == "kron"
    wrong = cases[("road_20k", 32)]
    assert wrong["rode_status"] == "wrong" and wrong["rode_ms"] != wrong["rode_ms"] and wrong["rode_err"] > 1e-3
    assert cases[("kron_20k", 64)]["rode_status"] == "error" and "refuses" in cases[("kron_20k", 64)]["rode_note"]
    assert cases[("road_20k", 128)]["rode_status"] == "out of range"
    assert cases[("road_20k", 64)]["rode_status"] == "ok"
    summary = read(tmp_path / "rode_compare_summary.csv")
    every = next(s for s in summary if s["split"] == "unseen" and s["N"] == "all")
    assert (every["cases"], every["compared"], every["rode_wrong"], every["rode_failed"], every["rode_out_of_range"]) == \
        ("6", "2", "1", "1", "2")
    assert float(every["geomean_over_rode"]) == pytest.approx(2.0)
    assert len(read(tmp_path / "rode_compare.csv")) == 6


def supervised(tmp_path, faults, stall=60.0, extra=()):
    script = tmp_path / "fake_worker.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(Path(compare.ROOT))!r}, {str(Path(__file__).parent)!r}]\n"
        "import test_rode_peer\n"
        "test_rode_peer.install_fakes()\n"
        "from benchmarks.peers import compare\n"
        "compare.main(sys.argv[1:])\n")
    argv = [*TINY, *extra, "--out", str(tmp_path)]
    args = compare.parse(argv)
    entries = compare.entries_of(args)
    plan = [[name, list(args.ns)] for name in entries]
    meta = {name: {"family": e.family, "split": e.split} for name, e in entries.items()}
    env_before = os.environ.get("FAKE_RODE_FAULTS")
    os.environ["FAKE_RODE_FAULTS"] = faults
    try:
        table = compare.supervise(plan, meta, [sys.executable, str(script), *argv], tmp_path, stall)
    finally:
        if env_before is None:
            os.environ.pop("FAKE_RODE_FAULTS")
        else:
            os.environ["FAKE_RODE_FAULTS"] = env_before
    return by_case(table.rows())


@pytest.mark.slow
def test_a_fault_ends_the_worker_and_a_new_one_goes_on_after_it(tmp_path):
    cases = supervised(tmp_path, "kron_20k:32:fault,road_20k:32:abort")
    assert set(cases) == {(g, n) for g in ("kron_20k", "road_20k") for n in (32, 64)}
    fault = cases[("kron_20k", 32)]
    assert fault["rode_status"] == "error" and "illegal memory access" in fault["rode_note"]
    assert fault["ours_status"] == "ok" and fault["ours_ms"] == 1.0
    abort = cases[("road_20k", 32)]
    assert abort["rode_status"] == "crashed" and "worker exit" in abort["rode_note"]
    assert abort["ours_status"] == "ok"
    assert cases[("kron_20k", 64)]["rode_status"] == "ok" and cases[("road_20k", 64)]["rode_status"] == "ok"
    # The events of every worker are kept, one "worker" line each: three workers ran.
    events = [json.loads(line) for line in (tmp_path / "rode_compare_events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "worker" for e in events) == 3


@pytest.mark.slow
def test_a_hung_case_is_ended_and_recorded_as_stalled(tmp_path):
    cases = supervised(tmp_path, "kron_20k:64:hang", stall=25.0, extra=["--graphs", "kron_20k"])
    assert cases[("kron_20k", 64)]["rode_status"] == "stalled"
    assert cases[("kron_20k", 32)]["rode_status"] == "ok"
