"""torch_tcsparse.distributed on 2, 3 and 4 gloo processes against one process: the product and
its gradients for every reduction (uneven parts, an empty part, isolated nodes, a rank without
halo, the GCN normalization from own rows, rows relabeled by a partition; the exchange
overlapped or not, in 16 bits or not, features fixed), the cost model's part shapes against the parts built,
the partition of blocks no process holds whole and the placement of their rows, the loss curves
of the distributed example's GCN, GraphSAGE (every aggregation) and GIN, and the benchmark's
smallest run. One set of processes per world size runs every check."""
import csv
import types

import pytest
import torch
import torch.distributed as dist

import graphs
import processes
from benchmarks import distributed as benchmark
from benchmarks.distributed import emulation
from examples.gcn import train_distributed
from graph_data import synthetic
from torch_tcsparse import TCSparseTensor
from torch_tcsparse import nn as tc_nn
from torch_tcsparse.distributed import (
    EmulatedPeers,
    GraphPart,
    NodePartition,
    Placement,
    block_bounds,
    gcn_part,
    partition_blocks,
    partition_rows,
    spmm,
)
from torch_tcsparse.distributed.model import part_shape

NUM_NODES = 60
CLOSED = 12
REDUCTIONS = ("mean", "max", "min")


def expected_products(matrix: torch.Tensor, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """The products, and the sums of their terms' magnitudes, which bound the error of rounding
    every term's X (or gradient) row once."""
    return {"y": matrix @ x, "x_grad": matrix.t() @ grad,
            "y_bound": matrix.abs() @ x.abs(), "x_grad_bound": matrix.t().abs() @ grad.abs()}


# Unit roundoff of the 16-bit halo dtypes.
HALO_ROUNDING = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def check_exchanges(part, case, nodes, y: torch.Tensor, x_grad: torch.Tensor) -> None:
    """Without overlap the product adds the same blocks' sums: equal to the bit. 16-bit halos
    round each received row once, forward and backward."""
    for overlap, halo_dtype in ((False, None), (True, torch.bfloat16), (False, torch.float16)):
        other = part.exchanging(overlap, halo_dtype)
        assert other.interior_t is part.interior_t and other.boundary_t is part.boundary_t
        x = case["x"][nodes].clone().requires_grad_()
        y_other = spmm(other, x)
        y_other.backward(case["grad"][nodes])
        label = f"{case['name']}, overlap={overlap}, halo_dtype={halo_dtype}"
        if halo_dtype is None:
            assert torch.equal(y_other, y) and torch.equal(x.grad, x_grad), label
            continue
        rounding = HALO_ROUNDING[halo_dtype]
        for got, want, bound in ((y_other, y, case["y_bound"][nodes]), (x.grad, x_grad, case["x_grad_bound"][nodes])):
            excess = (got - want).abs() - (rounding * bound + 1e-5)
            assert bool((excess <= 0).all()), f"{label}: {float(excess.max())} beyond the rounding bound"
        if part.num_halo and sum(part.send_counts):
            assert not torch.equal(y_other, y) or not torch.equal(x.grad, x_grad), f"{label}: nothing was rounded"


def normalized_dense(rowptr, col, values, num_nodes):
    """nn.gcn_norm (PyG's) of the graph, as a dense matrix A[target, source]."""
    row = torch.repeat_interleave(torch.arange(num_nodes), rowptr.diff())
    index, weight = tc_nn.gcn_norm(torch.stack([col, row]), values, num_nodes)
    dense = torch.zeros(num_nodes, num_nodes, dtype=weight.dtype)
    return dense.index_put_((index[1], index[0]), weight, accumulate=True)


def expected_reductions(rowptr, col, values, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """One process's mean, max and min products of the whole matrix, and their gradients for x."""
    matrix = TCSparseTensor.from_csr(rowptr, col, values, shape=(NUM_NODES, NUM_NODES))
    result = {}
    for reduce in REDUCTIONS:
        leaf = x.clone().requires_grad_()
        y = matrix.matmul(leaf, reduce=reduce)
        y.backward(grad)
        result[reduce] = (y.detach(), leaf.grad)
    return result


def make_case(name, rowptr, col, values, partition, normalize, gen, no_halo_rank=None):
    dtype = values.dtype
    matrix = (normalized_dense if normalize else graphs.dense)(rowptr, col, values, NUM_NODES)
    x = torch.randn(NUM_NODES, 5, generator=gen, dtype=dtype)
    grad = torch.randn(NUM_NODES, 5, generator=gen, dtype=dtype)
    reductions = {} if normalize else expected_reductions(rowptr, col, values, x, grad)
    return {"name": name, "csr": (rowptr, col, values), "partition": partition, "normalize": normalize,
            "x": x, "grad": grad, "no_halo_rank": no_halo_rank, "reductions": reductions,
            **expected_products(matrix, x, grad)}


def cases(world_size: int) -> list[dict]:
    gen = torch.Generator().manual_seed(world_size)
    closed = graphs.with_isolated_nodes_and_closed_block(NUM_NODES, CLOSED, seed=world_size)
    # Rank 0 owns the closed block (no halo); with 3 ranks or more, rank 1 owns nothing.
    if world_size == 2:
        bounds = (0, CLOSED, NUM_NODES)
    else:
        bounds = (0, CLOSED) + tuple(CLOSED + b for b in block_bounds(NUM_NODES - CLOSED, world_size - 2))
    uneven = NodePartition(torch.arange(NUM_NODES), bounds, "contiguous")
    row, col = graphs.symmetric_sbm(NUM_NODES, seed=world_size)
    rowptr, col, _ = graphs.csr_of(row, col, NUM_NODES)
    ones = torch.ones(col.numel(), dtype=torch.float32)
    result = [
        make_case("uneven", *closed, uneven, False, gen, no_halo_rank=0),
        make_case("uneven normalized", *closed, uneven, True, gen),
        make_case("contiguous normalized float32", rowptr, col, ones,
                  partition_rows(rowptr, col, world_size, "contiguous"), True, gen),
    ]
    multilevel = partition_rows(rowptr, col, world_size)
    return result + [make_case("multilevel", rowptr, col, ones, multilevel, False, gen)]


def check_emulated(part, case) -> None:
    """The rank's part built alone from the other ranks' requests (EmulatedPeers) sends and
    receives what the real one does."""
    partition, (rowptr, col, values) = case["partition"], case["csr"]
    rows, requested = emulation.rank_rows(partition, rowptr, col)
    rank = dist.get_rank()
    build = gcn_part if case["normalize"] else GraphPart.from_rows
    alone = build(*partition.rows(rowptr, col, values, rank), partition.bounds,
                  group=EmulatedPeers(rank, partition.num_parts, requested[rank]))
    assert torch.equal(alone.send_index, part.send_index) and torch.equal(alone.halo, part.halo), case["name"]
    assert (alone.send_counts, alone.recv_counts) == (part.send_counts, part.recv_counts), case["name"]
    assert torch.equal(alone.interior.csr.values, part.interior.csr.values), case["name"]


def check_fixed_features(part, case, nodes, y: torch.Tensor) -> None:
    """Features fixed on a part cross the link at the first product only; every reduction gives
    what an exchange at every product gives; an in-place change of them, or their requiring grad
    since, raises at the next product; features that require grad are refused."""
    fixed = part.exchanging(False, None)
    x = case["x"][nodes].clone()
    fixed.fix_features(x)
    exchanges = []
    gather = fixed.gather_halo
    fixed.gather_halo = lambda *args: exchanges.append(1) or gather(*args)
    for _ in range(2):
        assert torch.equal(spmm(fixed, x), y), case["name"]
    for reduce in REDUCTIONS:
        torch.testing.assert_close(spmm(fixed, x, reduce), spmm(part, x, reduce), msg=lambda m: f"{case['name']}: {m}")
    assert len(exchanges) == 1, (case["name"], len(exchanges))
    x.requires_grad_()
    with pytest.raises(ValueError, match="require grad since"):
        spmm(fixed, x)
    x = x.detach()
    fixed.fix_features(x)
    x.add_(1)
    with pytest.raises(ValueError, match="changed in place since"):
        spmm(fixed, x)
    with pytest.raises(ValueError, match="requires grad"):
        fixed.fix_features(x.clone().requires_grad_())


def check_reductions(part, case, nodes) -> None:
    """Mean, max and min against one process's, forward and backward, overlapped or not."""
    for reduce, (y_expected, grad_expected) in case["reductions"].items():
        for overlap in (False, True):
            x = case["x"][nodes].clone().requires_grad_()
            y = spmm(part.exchanging(overlap, None), x, reduce)
            y.backward(case["grad"][nodes])
            label = f"{case['name']}, reduce={reduce}, overlap={overlap}"
            torch.testing.assert_close(y, y_expected[nodes], msg=lambda m: f"{label}: {m}")
            torch.testing.assert_close(x.grad, grad_expected[nodes], msg=lambda m: f"{label}: {m}")


def check_products(all_cases) -> None:
    rank = dist.get_rank()
    for case in all_cases:
        partition = case["partition"]
        rowptr, col, values = partition.rows(*case["csr"], rank)
        build = gcn_part if case["normalize"] else GraphPart.from_rows
        part = build(rowptr, col, values, partition.bounds)
        nodes = partition.nodes(rank)
        x = case["x"][nodes].clone().requires_grad_()
        y = spmm(part, x)
        tolerance = {} if x.dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
        torch.testing.assert_close(y, case["y"][nodes], **tolerance, msg=lambda m: f"{case['name']}: {m}")
        y.backward(case["grad"][nodes])
        torch.testing.assert_close(x.grad, case["x_grad"][nodes], **tolerance, msg=lambda m: f"{case['name']}: {m}")
        check_exchanges(part, case, nodes, y.detach(), x.grad)
        check_fixed_features(part, case, nodes, y.detach())
        check_emulated(part, case)
        if not case["normalize"]:
            narrow = GraphPart.from_rows(rowptr.int(), col.int(), values, partition.bounds)
            assert torch.equal(spmm(narrow, x.detach()), y.detach()), f"{case['name']}: int32 indices"
            check_reductions(part, case, nodes)
        shape = part_shape(partition, *case["csr"][:2], self_loops=False)
        assert (shape.halo_in[rank], shape.halo_out[rank]) == (part.num_halo, sum(part.send_counts)), case["name"]
        if not case["normalize"]:
            assert shape.nnz[rank] == part.nnz, case["name"]
            assert shape.cut[rank] == part.boundary.nnz, case["name"]
        if case["no_halo_rank"] == rank:
            assert part.num_halo == 0 and sum(part.send_counts) > 0, f"{case['name']}: {part}"
        if part.num_own == 0:
            assert y.shape == (0, 5)
    with pytest.raises(ValueError, match=r"x must have shape"):
        spmm(part, torch.zeros(part.num_own + 1, 5, dtype=part.dtype))
    with pytest.raises(ValueError, match=r"halo_dtype must be one of .* got torch.int8"):
        part.exchanging(True, torch.int8)
    with pytest.raises(TypeError, match=r"overlap must be a bool, got int"):
        part.exchanging(1, None)
    with pytest.raises(ValueError, match=r"bounds must have world_size \+ 1"):
        GraphPart.from_rows(torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, (0, NUM_NODES))
    with pytest.raises(ValueError, match=r"reduce must be one of .* got 'prod'"):
        spmm(part, torch.zeros(part.num_own, 5, dtype=part.dtype), "prod")


# The benchmark's smallest run: a graph of 256 nodes, one timed epoch, three exchanges.
BENCHMARK_ARGS = ["--device", "cpu", "--scales", "8", "--epochs", "1", "--features", "8", "--hidden", "8",
                  "--link-mb", "1", "--configs", "plain,overlap-bf16,overlap", "--rebalance"]

# The example's models at a size that trains in a second: 3 layers with batch normalization and
# dropout, which depend on every rank's rows.
CONFIG = dict(layers=3, hidden=16, dropout=0.5, batch_norm=True, lr=0.01, weight_decay=5e-4, epochs=4, eval_steps=4)
TRAIN_SEED = 5
# (model, GraphSAGE's aggregation) of every loss curve checked.
MODELS = [("gcn", "mean")] + [("sage", aggr) for aggr in train_distributed.AGGREGATIONS] + [("gin", "mean")]


def training_task() -> types.SimpleNamespace:
    gen = torch.Generator().manual_seed(11)
    row, col = graphs.symmetric_sbm(NUM_NODES, seed=11)
    y = torch.randint(0, 3, (NUM_NODES, 1), generator=gen)
    x = torch.randn(NUM_NODES, 8, generator=gen) + y.float()
    order = torch.randperm(NUM_NODES, generator=gen)
    split = {"train": order[:30], "valid": order[30:45], "test": order[45:]}
    return types.SimpleNamespace(x=x, y=y, edge_index=torch.stack([col, row]), split=split, num_outputs=3,
                                 metric="acc", evaluator=None)


def one_process_losses(task, kind: str, aggr: str) -> list[float]:
    """The example's model and seeds on the whole graph in this process, without torch.distributed."""
    if kind == "gcn":
        index, weight = tc_nn.gcn_norm(task.edge_index, None, NUM_NODES)
        adjacency = TCSparseTensor.from_edge_index(index, weight, num_nodes=NUM_NODES)
    else:
        adjacency = TCSparseTensor.from_edge_index(task.edge_index, num_nodes=NUM_NODES)
    torch.manual_seed(TRAIN_SEED)
    model = train_distributed.DistributedGNN(kind, task.x.size(1), CONFIG["hidden"], task.num_outputs,
                                             CONFIG["layers"], CONFIG["dropout"], CONFIG["batch_norm"], aggr)
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"], weight_decay=CONFIG["weight_decay"])
    train, nodes, losses = task.split["train"], torch.arange(NUM_NODES), []
    for epoch in range(1, CONFIG["epochs"] + 1):
        model.train()
        optimizer.zero_grad()
        out = model(task.x, adjacency, nodes, train_distributed.dropout_seed(TRAIN_SEED, epoch))
        loss = train_distributed.node_loss_sum(out[train], task.y[train], "acc") / train.numel()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def check_placement(world_size: int, expected: NodePartition, rowptr, col) -> None:
    """Blocks of an R-MAT graph partitioned on rank 0 and placed: every rank holds the rows,
    columns (as partition positions) and node ids that the whole graph's partition gives it."""
    rank = dist.get_rank()
    bounds = block_bounds(rowptr.numel() - 1, world_size)
    first, end = bounds[rank], bounds[rank + 1]
    block_rowptr = rowptr[first:end + 1] - rowptr[first]
    block_col = col[int(rowptr[first]):int(rowptr[end])]
    part = partition_blocks(block_rowptr, block_col, bounds, seed=3, gather="whole")
    placement = Placement(part, bounds)
    assert placement.bounds == expected.bounds
    values = torch.arange(col.numel(), dtype=torch.float64)[int(rowptr[first]):int(rowptr[end])]
    placed = placement.move_csr(block_rowptr, block_col, values)
    wanted = expected.rows(rowptr, col, torch.arange(col.numel(), dtype=torch.float64), rank)
    for got, want, name in zip(placed, wanted, ("rowptr", "col", "values")):
        assert torch.equal(got.long() if name == "col" else got, want), name
    assert torch.equal(placement.move(torch.arange(first, end)), expected.nodes(rank))
    with pytest.raises(ValueError, match=r"part must hold one entry per row of this rank's block"):
        Placement(part[:-1], bounds)


def check_all(product_cases, task, placement_case, losses_path, benchmark_out) -> None:
    check_products(product_cases)
    check_placement(dist.get_world_size(), *placement_case)
    benchmark.measure(benchmark.parse_args(BENCHMARK_ARGS + ["--out", str(benchmark_out)]), torch.device("cpu"))
    bounds = block_bounds(NUM_NODES, dist.get_world_size())
    block = train_distributed.block_of(task, bounds, dist.get_rank())
    placed = train_distributed.place(block, torch.device("cpu"), "auto", 0, 0)
    parts = {kind: train_distributed.build_part(placed, kind) for kind in train_distributed.MODELS}
    losses = {}
    for kind, aggr in MODELS:
        result = train_distributed.train_placed(block, placed, parts[kind], CONFIG, torch.device("cpu"), TRAIN_SEED,
                                                kind, aggr)
        losses[kind, aggr] = result["losses"]
    if dist.get_rank() == 0:
        torch.save(losses, losses_path)


def placement_case(world_size: int):
    row, col, num_nodes = synthetic.rmat(9, seed=world_size)
    rowptr, col, _ = graphs.csr_of(row, col, num_nodes)
    return partition_rows(rowptr, col, world_size, seed=3), rowptr, col


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda p: f"{p} processes")
def distributed_run(request, tmp_path_factory):
    """Runs every check on P processes; returns the loss curves of their training."""
    world_size = request.param
    losses_path = tmp_path_factory.mktemp("losses") / "losses.pt"
    benchmark_out = tmp_path_factory.mktemp("benchmark")
    task = training_task()
    processes.run(world_size, check_all, cases(world_size), task, placement_case(world_size), losses_path,
                  benchmark_out)
    return task, torch.load(losses_path), benchmark_out / "distributed.csv"


def test_product_and_gradients_match_one_process(distributed_run):
    """The product and placement checks ran in the processes (an assertion there fails the fixture)."""
    task, losses, _ = distributed_run
    assert set(losses) == set(MODELS)


@pytest.mark.parametrize("kind, aggr", MODELS, ids=lambda value: value)
def test_loss_curve_matches_one_process(distributed_run, kind, aggr):
    task, losses, _ = distributed_run
    expected = one_process_losses(task, kind, aggr)
    assert losses[kind, aggr][-1] < losses[kind, aggr][0], "the model learns"
    torch.testing.assert_close(torch.tensor(losses[kind, aggr]), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_benchmark_rows_and_model(distributed_run, tmp_path):
    """The benchmark's CPU run wrote a one-process row and a P-process row per exchange; the cost
    model reads them and predicts the measured P from the one-process numbers."""
    _, _, csv_path = distributed_run
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    world_size = int(rows[-1]["gpus"])
    assert [r["gpus"] for r in rows] == ["1"] + [str(world_size)] * 3
    assert all(r["status"] == "ok" for r in rows)
    plain, bf16, overlap = rows[1:]
    assert (plain["config"], plain["halo_bits"], bf16["config"], bf16["halo_bits"]) == ("plain", "32", "overlap-bf16", "16")
    assert plain["partitioner"] == "multilevel-clusters" and plain["row_weight"] == bf16["row_weight"]
    # --rebalance: the time weight fitted to the ranks timed alone; the memory weight the one-process run's.
    assert all(int(w) >= 0 for w in plain["row_weight"].split(";"))
    assert plain["row_weight"].split(";")[1:] == rows[0]["row_weight"].split(";")[1:]
    assert int(plain["halo_rows"]) <= int(plain["cut_nonzeros"])
    for row, element in ((plain, 4), (bf16, 2)):
        assert int(row["halo_bytes_per_epoch"]) == int(row["halo_rows"]) * int(row["exchanged_width"]) * element
    assert sum(int(n) for n in plain["nnz_per_rank"].split(";")) == int(rows[0]["nnz"])
    # P ranks train the one-GPU run's model: the same loss curve (dropout hashes node ids).
    one = [float(v) for v in rows[0]["losses"].split(";")]
    assert len(one) == 3 and all(v > 0 for v in one)
    for row in (plain, overlap):
        assert [float(v) for v in row["losses"].split(";")] == pytest.approx(one, rel=1e-4)
    assert sum(int(n) for n in plain["rows_per_rank"].split(";")) == int(rows[0]["nodes"])
    assert sum(int(n) for n in plain["halo_per_rank"].split(";")) == int(plain["halo_rows"])
    benchmark.main(["--predict", str(csv_path), "--parts", f"1,{world_size},4", "--out", str(tmp_path)])
    with open(tmp_path / "distributed_model.csv", newline="") as handle:
        results = list(csv.DictReader(handle))
    predicted = [r for r in results if r["partition"] == "afresh"]
    assert [int(r["gpus"]) for r in predicted] == [1, world_size, 4]
    assert predicted[1]["measured_epoch_ms"] == plain["epoch_ms"]
    assert predicted[1]["measured_overlapped_epoch_ms"] == overlap["epoch_ms"]
    # The run again, modelled on the partition it trained on.
    (on_run,) = [r for r in results if r["partition"] == "run"]
    assert (int(on_run["gpus"]), on_run["measured_epoch_ms"]) == (world_size, plain["epoch_ms"])
    for row in results:
        assert float(row["predicted_overlapped_epoch_ms"]) <= float(row["predicted_epoch_ms"])
    assert float(predicted[0]["predicted_epoch_ms"]) == pytest.approx(float(rows[0]["epoch_ms"]), rel=1e-6)
    assert "| rmat8 | 4 |" in (tmp_path / "distributed_model.md").read_text()


def test_model_leaves_out_a_graph_whose_one_gpu_run_failed(distributed_run, tmp_path, capsys):
    """A graph that did not fit one GPU has no run to scale from: the model says so and models
    the others."""
    _, _, csv_path = distributed_run
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    failed = dict(rows[0], graph="rmat9", status="out of memory", epoch_ms="nan")
    with_failed = tmp_path / "distributed.csv"
    with open(with_failed, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows + [failed])
    benchmark.main(["--predict", str(with_failed), "--parts", "2", "--out", str(tmp_path)])
    assert "rmat9: no one-GPU run that ran, not modelled" in capsys.readouterr().out
    with open(tmp_path / "distributed_model.csv", newline="") as handle:
        assert {r["graph"] for r in csv.DictReader(handle)} == {"rmat8"}
