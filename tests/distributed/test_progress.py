"""The stages a part's build reports, and the benchmark's progress lines, in one process."""
import re

import pytest
import torch

import graphs
from benchmarks.distributed import progress as progress_lines
from torch_tcsparse.distributed import EmulatedPeers, GraphPart, gcn_part

NUM_NODES = 120


def sbm_csr():
    row, col = graphs.symmetric_sbm(NUM_NODES, seed=5)
    rowptr, col, _ = graphs.csr_of(row, col, NUM_NODES)
    return rowptr, col


def rank_of_two():
    """Rank 0 of 2 alone: the other rank asks for its first three rows."""
    return EmulatedPeers(0, 2, [torch.zeros(0, dtype=torch.long), torch.arange(3)]), (0, NUM_NODES // 2, NUM_NODES)


def test_build_reports_its_stages_in_order():
    rowptr, col = sbm_csr()
    peers, bounds = rank_of_two()
    own = slice(0, bounds[1] + 1)
    rows, cols = rowptr[own], col[: int(rowptr[bounds[1]])]
    stages = []
    GraphPart.from_rows(rows, cols, None, bounds, peers, progress=stages.append)
    assert stages == ["exchange plan", "blocks", "transposes"]
    stages.clear()
    part = gcn_part(rows, cols, None, bounds, peers, progress=stages.append)
    assert stages == ["self-loops", "exchange plan", "blocks", "transposes", "normalization"]
    assert part.num_own == bounds[1]


@pytest.mark.parametrize("build", [GraphPart.from_rows, gcn_part])
def test_progress_must_be_a_function(build):
    rowptr, col = sbm_csr()
    whole = EmulatedPeers(0, 1, [torch.zeros(0, dtype=torch.long)])
    with pytest.raises(TypeError, match=r"progress must be a function of the stage's name or None, got str"):
        build(rowptr, col, None, (0, NUM_NODES), whole, progress="print")


def test_progress_line_names_the_stage_and_every_rank_memory():
    line = progress_lines.format_line(93.25, "rmat26", "partitioned", [(8.12, 30.2), (8.3, 9.0), None])
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d \+93\.2s\] rmat26: partitioned \| GB now/peak per rank: "
                        r"8\.1/30\.2 8\.3/9\.0 -", line), line
    # On the CPU no memory is measured: the stage alone.
    assert progress_lines.format_line(1.0, "", "link measured", [None, None]).endswith("] link measured")


def test_one_process_prints_its_stages_and_a_failure(capsys):
    progress = progress_lines.Progress(torch.device("cpu"), 0, 1)
    progress.graph = "rmat8"
    progress("graph generated")
    progress.epochs("plain")("epoch 0: forward done")
    assert progress.stage == "plain: epoch 0: forward done"
    try:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.00 GiB")
    except torch.cuda.OutOfMemoryError as error:
        progress.report_failure(error)
    captured = capsys.readouterr()
    assert [line.split("] ", 1)[1] for line in captured.out.splitlines()] == [
        "rmat8: graph generated", "rmat8: plain: epoch 0: forward done"]
    first = captured.err.splitlines()[0]
    assert first.endswith("rank 0 failed after rmat8: plain: epoch 0: forward done: OutOfMemoryError: "
                          "CUDA out of memory. Tried to allocate 7.00 GiB"), first
    assert "Traceback" in captured.err
