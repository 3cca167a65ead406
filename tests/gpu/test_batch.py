"""GPU tests of ``TCSparseTensor.from_batch``: products of the CSR-only form run the rows kernel
without building the Tensor-Core layout until the selector has counted its price in products,
and equal the fully converted matrix's, forward and backward, in every kernel dtype; PyG layers
on a CUDA bipartite block. The neighbour sampler on CUDA: its batches keep every invariant, a
CUDA generator repeats them, a training step on their blocks equals PyG's and leaves each block's
layout unbuilt, and its blocks convert and multiply forward without waiting for the device; the
rows split and a transpose on CUDA equal the CPU's; the mini-batch benchmark end to end."""
import copy

import pytest
import torch

from converted_blocks import record_converted_blocks
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.structure import BUILD_AFTER_USES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NUM_SRC, NUM_DST = 3000, 700
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative to the largest reference value; both sides sum in float32, in another order.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def block(dtype, seed=0):
    """A sampled block's shape: up to 15 sources per target, one long row (split into pieces)."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, NUM_DST - 1, (NUM_DST * 10,), generator=g)
    targets[:600] = 3
    edges = torch.stack([torch.randint(0, NUM_SRC, (targets.numel(),), generator=g), targets]).cuda()
    weights = (torch.rand(targets.numel(), generator=g) + 0.5).to(device="cuda", dtype=dtype)
    return edges, weights


def is_pending(matrix) -> bool:
    return matrix._structure.layout_pending


def assert_close(ours, theirs, dtype):
    scale = max(float(theirs.abs().max()), 1.0)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_light_products_run_rows_and_equal_the_converted_matrix(kernels, dtype, reduce):
    edges, weights = block(dtype)
    light = TCSparseTensor.from_batch(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    full = TCSparseTensor.from_edge_index(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    x = torch.randn(NUM_SRC, 128, device="cuda", dtype=dtype)
    assert_close(light.matmul(x, reduce=reduce), full.matmul(x, reduce=reduce), dtype)
    assert is_pending(light)
    if reduce != "max":
        s = light._structure
        assert s.selection.choose(s.layout, 128, dtype, x.device)[0] == "rows"


@pytest.mark.parametrize("weighted", [False, True])
def test_distinct_edges_take_the_one_sort_build(kernels, weighted):
    edges, weights = block(torch.float32, seed=7)
    edges = torch.unique(edges, dim=1)
    edges = edges[:, torch.randperm(edges.shape[1], device="cuda")]
    weights = weights[: edges.shape[1]] if weighted else None
    light = TCSparseTensor.from_batch(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    full = TCSparseTensor.from_edge_index(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    assert light._structure._derived["max_row_nnz"] == int(torch.bincount(edges[1]).max())
    for ours, theirs in zip((light.crow_indices(), light.col_indices(), light.values()),
                            (full.crow_indices(), full.col_indices(), full.values())):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_light_gradients_equal_the_converted_matrix(kernels, dtype):
    edges, weights = block(dtype, seed=1)
    results = []
    for build in (TCSparseTensor.from_batch, TCSparseTensor.from_edge_index):
        values = weights.clone().requires_grad_()
        matrix = build(edges, values, num_nodes=(NUM_SRC, NUM_DST))
        x = torch.randn(NUM_SRC, 64, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(2))
        x.requires_grad_()
        y = matrix @ x
        weight = torch.randn(y.shape, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(3))
        results.append([y, *torch.autograd.grad((y * weight).float().sum(), (x, values))])
    for ours, theirs in zip(*results):
        assert_close(ours, theirs, dtype)


def test_the_layout_is_built_after_its_price_in_products(kernels):
    edges, weights = block(torch.float32, seed=4)
    light = TCSparseTensor.from_batch(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    full = TCSparseTensor.from_edge_index(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    x = torch.randn(NUM_SRC, 128, device="cuda")
    for _ in range(BUILD_AFTER_USES):
        light @ x
    assert is_pending(light)
    assert_close(light @ x, full @ x, torch.float32)
    assert not is_pending(light)
    torch.testing.assert_close(light.t().to_dense(), full.t().to_dense())


def test_a_light_matrix_moved_to_cuda_stays_light(kernels):
    edges, weights = block(torch.float32, seed=5)
    light = TCSparseTensor.from_batch(edges.cpu(), weights.cpu(), num_nodes=(NUM_SRC, NUM_DST)).cuda()
    assert is_pending(light) and light.device.type == "cuda"
    full = TCSparseTensor.from_edge_index(edges, weights, num_nodes=(NUM_SRC, NUM_DST))
    x = torch.randn(NUM_SRC, 32, device="cuda")
    assert_close(light @ x, full @ x, torch.float32)
    assert is_pending(light)


pyg_nn = pytest.importorskip("torch_geometric.nn")


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_sage_on_a_light_cuda_block(kernels, aggr):
    from torch_tcsparse.nn import fused

    edges, weights = block(torch.float32, seed=6)
    ones = torch.ones_like(weights)
    light = TCSparseTensor.from_batch(edges, ones, num_nodes=(NUM_SRC, NUM_DST))
    reference_adj = TCSparseTensor.from_edge_index(edges.cpu(), ones.cpu().double(),
                                                   num_nodes=(NUM_SRC, NUM_DST)).to_torch_csr()
    torch.manual_seed(0)
    layer = fused(pyg_nn.SAGEConv)(16, 8, aggr=aggr).double()
    x_src, x_dst = torch.randn(NUM_SRC, 16, dtype=torch.float64), torch.randn(NUM_DST, 16, dtype=torch.float64)

    def run(model, adj_t, device, dtype):
        xs = x_src.to(device=device, dtype=dtype).requires_grad_()
        xd = x_dst.to(device=device, dtype=dtype).requires_grad_()
        out = model((xs, xd), adj_t)
        out.double().sum().backward()
        return [out, xs.grad, xd.grad]

    ours = run(copy.deepcopy(layer).cuda().float(), light, "cuda", torch.float32)
    expected = run(copy.deepcopy(layer), reference_adj, "cpu", torch.float64)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got.double().cpu(), want, rtol=0, atol=5e-3 * max(float(want.abs().max()), 1.0))


def cuda_sampler(fanout, num_nodes=4000, seed=0):
    from graph_data import synthetic
    from torch_tcsparse.loader import NeighborSampler

    row, col, _, _, _ = synthetic.planted_classes(num_nodes, 5, 4, 12.0, seed=seed, device="cuda")
    return NeighborSampler.from_edge_index(torch.stack([col, row]), fanout, num_nodes)


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 3]])
def test_cuda_batches_keep_every_invariant_and_repeat_from_a_generator(fanout):
    from sampling.batches import check_batch

    sampler = cuda_sampler(fanout)
    seeds = torch.randperm(4000, device="cuda")[:64]
    batches = [sampler.sample(seeds, torch.Generator("cuda").manual_seed(3)) for _ in range(2)]
    check_batch(sampler, batches[0], seeds)
    assert batches[0].nodes.is_cuda and batches[0].edge_index.is_cuda
    assert torch.equal(batches[0].edge_index, batches[1].edge_index)
    with pytest.raises(ValueError, match="generator"):
        sampler.sample(seeds, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="device"):
        sampler.sample(seeds.cpu())


def test_a_loader_takes_a_cuda_generator_without_an_index():
    from torch_tcsparse.loader import BlockLoader

    sampler = cuda_sampler([5, 3])
    loaders = [BlockLoader(sampler, torch.arange(0, 4000, 7, device="cuda"), 128, shuffle=True,
                           generator=torch.Generator("cuda").manual_seed(5)) for _ in range(2)]
    first, second = (next(iter(loader)) for loader in loaders)
    assert torch.equal(first.nodes, second.nodes)
    with pytest.raises(ValueError, match="generator"):
        BlockLoader(sampler, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_a_block_step_on_cuda_equals_pyg_and_leaves_the_layouts_unbuilt(kernels, aggr, monkeypatch):
    from examples.sage import blocks, models

    made = record_converted_blocks(monkeypatch)
    batch = cuda_sampler([10, 5, 3]).sample(torch.arange(0, 4000, 40, device="cuda"),
                                             torch.Generator("cuda").manual_seed(1))
    x = torch.randn(4000, 16, device="cuda")
    y = torch.randint(0, 5, (4000,), device="cuda")
    results = {}
    for backend in models.BACKENDS:
        torch.manual_seed(0)
        model = models.SAGE(backend, 16, 32, 5, 3, 0.0, aggr).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        loss = blocks.train_step(model, optimizer, batch, x, y, backend, models.pyg_format_for(aggr, x.device))
        results[backend] = [loss] + [p.grad for p in model.parameters()]
    for ours, theirs in zip(results["ours"], results["pyg"]):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * max(float(theirs.abs().max()), 1.0))
    assert len(made) == 3 and all(is_pending(block) for block in made)


def test_the_batch_benchmark_runs_on_cuda(kernels, tmp_path):
    pytest.importorskip("ogb", reason="the SAGE example's evaluation reads OGB's evaluator")
    from benchmarks import batch

    rows = batch.main(["--device", "cuda", "--nodes", "20000", "--batch-size", "64", "--batches", "1", "--reps", "2",
                       "--train", "--epochs", "1", "--epoch-batches", "2", "--seeds", "1", "--accuracy-epochs", "1",
                       "--full-accuracy-epochs", "2", "--hidden", "16", "--out", str(tmp_path)])
    assert {row["route"] for row in rows if "route" in row} == set(batch.ROUTES)
    epochs = [row for row in rows if "epoch_ms" in row]
    assert len(epochs) == 6 and all(row["epoch_ms"] > 0 for row in epochs)
    accuracy = {(row["mode"], row["backend"]): row["test_acc_mean"] for row in rows if "test_acc_mean" in row}
    for mode in ("mini-batch", "full-batch"):
        assert accuracy[(mode, "ours")] == pytest.approx(accuracy[(mode, "pyg")], abs=0.01)


def test_sampled_blocks_convert_without_waiting_for_the_device_and_equal_from_batch(kernels):
    batch = cuda_sampler([15, 10, 5]).sample(torch.arange(0, 4000, 9, device="cuda"),
                                              torch.Generator("cuda").manual_seed(2))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        blocks = batch.blocks()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for block, (edge_index, sizes) in zip(blocks, batch.layer_edges(), strict=True):
        checked = TCSparseTensor.from_batch(edge_index, num_nodes=sizes)
        for ours, theirs in ((block.crow_indices(), checked.crow_indices()),
                             (block.col_indices(), checked.col_indices()), (block.values(), checked.values())):
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
        assert block._structure.max_row_nnz() == checked._structure.max_row_nnz()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_forward_products_of_sampled_blocks_wait_for_no_device(kernels, reduce):
    """The rows kernel's indices come from the longest row the sampler read: no split to count."""
    batch = cuda_sampler([15, 10, 5]).sample(torch.arange(0, 4000, 9, device="cuda"),
                                              torch.Generator("cuda").manual_seed(3))
    x = torch.randn(batch.nodes.numel(), 32, device="cuda")
    expected = x.double()
    for edge_index, sizes in batch.layer_edges():
        checked = TCSparseTensor.from_batch(edge_index.cpu(), num_nodes=sizes, dtype=torch.float64)
        expected = checked.matmul(expected.cpu(), reduce=reduce).cuda()
    blocks = batch.blocks()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = x
        for block in blocks:
            out = block.matmul(out, reduce=reduce)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(is_pending(block) for block in blocks)
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("graph", ["planted", "rmat"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_training_steps_of_sampled_blocks_wait_for_no_device(kernels, reduce, graph):
    """Forward and backward, twice: the first backward pass through a block scatters dX from
    the forward's operands (no transpose built); the second multiplies by the transpose, which
    (its longest row unknown) splits its long rows by a split sized by bounds
    (``csr_rows.padded_row_pieces``). Neither step waits for the device; dX equals a float64
    reference. R-MAT's hubs, picked by many targets, give the transposes split rows; the fan-outs
    keep the blocks' own rows short (a block whose longest row, known from the sampler, is split
    takes the exact split, which reads the device)."""
    if graph == "planted":
        sampler = cuda_sampler([15, 10, 5])
    else:
        from graph_data import synthetic
        from torch_tcsparse.loader import NeighborSampler

        row, col, num_nodes = synthetic.rmat(12, 8, seed=3, device="cuda")
        sampler = NeighborSampler.from_edge_index(torch.stack([col, row]), [25, 10], num_nodes)
    num_nodes = 4000 if graph == "planted" else 1 << 12
    batch = sampler.sample(torch.arange(0, num_nodes, 9, device="cuda"), torch.Generator("cuda").manual_seed(4))
    x = torch.randn(batch.nodes.numel(), 32, device="cuda")
    blocks = batch.blocks()
    expected_x = x.double().cpu().requires_grad_()
    expected = expected_x
    for edge_index, sizes in batch.layer_edges():
        checked = TCSparseTensor.from_batch(edge_index.cpu(), num_nodes=sizes, dtype=torch.float64)
        expected = checked.matmul(expected, reduce=reduce) + expected[: sizes[1]]
    expected.square().sum().backward()
    if graph == "rmat":
        from torch_tcsparse import csr_rows

        longest_source = max(int(torch.bincount(edge_index[0]).max()) for edge_index, _ in batch.layer_edges())
        assert longest_source > csr_rows.split_piece_nnz(blocks[0].nnz, None, torch.float32), "no split transpose"
    x.requires_grad_()
    for scattered in (True, False):
        x.grad = None
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = x
            for block in blocks:
                out = block.matmul(out, reduce=reduce) + out[: block.size(0)]
            out.square().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(is_pending(block) for block in blocks)
        assert all((block._structure.linked_transpose() is None) == scattered for block in blocks)
        assert_close(out.detach(), expected.detach().cuda(), torch.float32)
        assert_close(x.grad, expected_x.grad.cuda(), torch.float32)


def test_row_pieces_and_transposes_on_cuda_equal_the_cpu(kernels):
    from torch_tcsparse import csr_rows
    from torch_tcsparse.formats.csr import CSR, transpose_pattern

    edges, weights = block(torch.float32)
    matrix = TCSparseTensor.from_batch(edges.cpu(), weights.cpu(), num_nodes=(NUM_SRC, NUM_DST))
    csr = matrix.csr
    for piece_nnz in (8, 32, 256):
        for ours, theirs in zip(csr_rows.row_pieces(csr.rowptr.cuda(), piece_nnz)[:3],
                                csr_rows.row_pieces(csr.rowptr, piece_nnz)[:3]):
            assert ours.dtype == theirs.dtype and torch.equal(ours.cpu(), theirs)
    on_gpu = CSR(csr.rowptr.cuda(), csr.col.cuda(), None, csr.num_rows, csr.num_cols)
    for ours, theirs in zip(transpose_pattern(on_gpu), transpose_pattern(csr)):
        assert ours.dtype == theirs.dtype and torch.equal(ours.cpu(), theirs)
