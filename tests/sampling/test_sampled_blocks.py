"""The blocks of a batch the sampler drew: the same matrices as ``from_batch`` builds from their
edges (CSR, values, longest row), converted without any operation that would wait for a GPU; a
batch made by hand is still checked as any input."""
import pytest
import torch

from graph_data import synthetic
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.conversion import _distinct_edges_csr
from torch_tcsparse.loader import NeighborSampler, SampledBatch

from device_reads import DeviceReads
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounts(TorchDispatchMode):
    """The aten operations dispatched while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def sampled(fanout, num_seeds=40, scale=10):
    row, col, num_nodes = synthetic.rmat(scale, 8, seed=1)
    sampler = NeighborSampler.from_edge_index(torch.stack([col, row]), fanout, num_nodes)
    seeds = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))[:num_seeds]
    return sampler.sample(seeds, torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 2], [3], [2, 40]])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16])
def test_blocks_equal_from_batch_of_their_edges(fanout, dtype):
    batch = sampled(fanout)
    for block, (edge_index, sizes) in zip(batch.blocks(dtype), batch.layer_edges(), strict=True):
        checked = TCSparseTensor.from_batch(edge_index, num_nodes=sizes, dtype=dtype)
        ours, theirs = block._structure, checked._structure
        assert block.shape == checked.shape and block.dtype == checked.dtype
        for got, want in ((ours.rowptr, theirs.rowptr), (ours.col, theirs.col), (block._values, checked._values)):
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert ours.layout_pending and ours.linked_transpose() is None
        degree = theirs.rowptr[1:] - theirs.rowptr[:-1]
        assert ours.max_row_nnz() == (int(degree.max()) if degree.numel() else 0)


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 2], [3, 1, 2]])
def test_a_block_alone_equals_it_among_the_blocks(fanout):
    batch = sampled(fanout)
    for layer, block in enumerate(batch.blocks(torch.float64)):
        alone = batch.block(layer, torch.float64)
        ours, theirs = block._structure, alone._structure
        assert block.shape == alone.shape and ours.max_row_nnz() == theirs.max_row_nnz()
        for got, want in ((ours.rowptr, theirs.rowptr), (ours.col, theirs.col), (block._values, alone._values)):
            assert got.dtype == want.dtype and torch.equal(got, want)


# What a batch's blocks may dispatch beyond views: rowptr off the ascending targets, the
# row-major key, its sort, its cast to the int32 columns, then each block's unit values.
SORT_OPS = ["aten._convert_indices_from_coo_to_csr.default", "aten.add.Tensor", "aten.sort.default",
            "aten._to_copy.default"]
VIEW_OPS = {"aten.slice.Tensor", "aten.unbind.int"}


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 2], [4, 3, 2, 2]])
def test_blocks_sort_once_and_fill_each_blocks_values(fanout):
    """The whole batch sorts once; every later block's indices are views of the first's, and
    each block fills its own unit values, so a write to one block's values reaches no other."""
    batch = sampled(fanout)
    with OpCounts() as counted:
        blocks = batch.blocks()
    assert [op for op in counted.ops if op not in VIEW_OPS] == SORT_OPS + ["aten.ones.default"] * len(blocks)
    assert len(counted.ops) <= len(SORT_OPS) + len(blocks) + 1 + 2 * (len(blocks) - 1)
    first = blocks[0]
    for block in blocks:
        for mine, held in ((block._structure.rowptr, first._structure.rowptr),
                           (block._structure.col, first._structure.col)):
            assert mine.untyped_storage().data_ptr() == held.untyped_storage().data_ptr()
    blocks[-1].values().mul_(2)
    assert all(bool((block.values() == 1).all()) for block in blocks[:-1])


def test_a_saved_block_holds_its_own_indices_alone(tmp_path):
    """A later block's arrays are views of the first block's; its file stores its own."""
    import torch_tcsparse

    blocks = sampled([15, 10, 5]).blocks()
    torch.save(blocks[-1], tmp_path / "block.pt")
    loaded = torch_tcsparse.load(tmp_path / "block.pt")
    pairs = ((loaded.crow_indices(), blocks[-1].crow_indices()), (loaded.col_indices(), blocks[-1].col_indices()),
             (loaded.values(), blocks[-1].values()))
    for got, want in pairs:
        assert torch.equal(got, want) and got.untyped_storage().nbytes() == want.numel() * want.element_size()


def test_a_block_narrower_than_the_one_that_holds_it_gets_int32_indices(monkeypatch):
    """A block whose sizes fit int32 takes int32 indices even from an int64 CSR that holds it."""
    from torch_tcsparse import conversion

    batch = sampled([4, 3])
    (first, (first_sources, _)), (edges, sizes) = batch.layer_edges()
    widest = max(first_sources, first.size(1))
    monkeypatch.setattr(conversion, "index_dtype_for",
                        lambda *counts: torch.int64 if max(counts) >= widest else torch.int32)
    outer, inner = batch.blocks()
    checked = TCSparseTensor.from_batch(edges, num_nodes=sizes)._structure
    assert outer._structure.col.dtype == torch.int64
    assert inner._structure.rowptr.dtype == inner._structure.col.dtype == torch.int32
    assert torch.equal(inner._structure.rowptr, checked.rowptr) and torch.equal(inner._structure.col, checked.col)
    assert inner._values.dtype == torch.float32 and inner._values.numel() == edges.size(1)


def test_blocks_beyond_int32_sort_their_edges_as_any_row_major_key(monkeypatch):
    """Where an index needs int64 the key is target * num_sources + source (the int32 route's
    target * 2**32 + source would overflow): the same CSR, in int64."""
    from torch_tcsparse import conversion

    monkeypatch.setattr(conversion, "index_dtype_for", lambda *sizes: torch.int64)
    batch = sampled([15, 10, 5])
    for block, (edge_index, sizes) in zip(batch.blocks(), batch.layer_edges(), strict=True):
        checked = TCSparseTensor.from_batch(edge_index, num_nodes=sizes)._structure
        ours = block._structure
        assert ours.rowptr.dtype == ours.col.dtype == torch.int64
        assert torch.equal(ours.rowptr, checked.rowptr.long()) and torch.equal(ours.col, checked.col.long())


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 2]])
def test_blocks_of_a_sampled_batch_wait_for_no_device(fanout):
    batch = sampled(fanout).to("cpu")
    with DeviceReads() as reads:
        blocks = batch.blocks()
        batch.block(0, torch.float64)
    assert reads.ops == []
    # The checked route reads once, which the recorder sees.
    edge_index, sizes = batch.layer_edges()[0]
    with DeviceReads() as reads:
        _distinct_edges_csr(edge_index, None, sizes, None)
    assert reads.ops == ["tolist"]
    assert len(blocks) == batch.num_layers


def test_the_sampler_reads_the_device_once_per_hop_for_its_edges():
    """Its edge count and longest row in one read, where repeat_interleave read the count alone."""
    row, col, num_nodes = synthetic.rmat(9, 8, seed=1)
    sampler = NeighborSampler.from_edge_index(torch.stack([col, row]), [5, 3], num_nodes)
    with DeviceReads() as reads:
        sampler.sample(torch.arange(30), torch.Generator().manual_seed(2))
    assert reads.ops.count("tolist") == 2
    assert "aten.repeat_interleave.Tensor" not in reads.ops


def test_a_batch_made_by_hand_is_checked():
    batch = sampled([3, 2])
    bad = batch.edge_index.clone()
    bad[0, 0] = batch.nodes.numel() + 5
    made = SampledBatch(batch.nodes, bad, batch.num_sampled_nodes, batch.num_sampled_edges)
    with pytest.raises(ValueError, match="edge_index"):
        made.blocks()
    plain = SampledBatch(batch.nodes, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    for block, ours in zip(plain.blocks(), batch.blocks(), strict=True):
        assert torch.equal(block._structure.col, ours._structure.col)


@pytest.mark.parametrize("layer", [-1, 2, 1.0, True])
def test_block_names_a_bad_layer(layer):
    with pytest.raises(ValueError, match="layer"):
        sampled([3, 2]).block(layer)


def test_block_names_a_bad_dtype():
    with pytest.raises(TypeError, match="dtype"):
        sampled([3, 2]).blocks(torch.int32)


def test_a_training_step_on_the_rows_path_reads_nothing_from_the_device(monkeypatch):
    """The steps a GPU runs, on the CPU: the kernels' choice taken as on CUDA (the rows kernel and
    its scatter, played by torch ops). Conversion and forward products read nothing, nor does the
    first backward pass (dX scattered from the forward's operands), nor a second one through the
    same blocks, which builds their transposes: their longest row stays unread in float32, and
    their split is sized by bounds from nnz (``csr_rows.padded_row_pieces``)."""
    from torch_tcsparse import kernels

    def rows_kernel(x, rowptr, col, values, pieces, num_cols, bias=None, row_map=None, addend=None):
        matrix = torch.sparse_csr_tensor(rowptr.long(), col.long(), values, (rowptr.numel() - 1, num_cols))
        return matrix @ x if bias is None else matrix @ x + bias

    def rows_scatter(grad_y, rowptr, col, values, pieces, num_cols, row_map=None):
        rows = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), (rowptr[1:] - rowptr[:-1]).long(),
                                       output_size=col.numel())
        rows = rows if row_map is None else row_map.long()[rows]
        grad_x = torch.zeros(num_cols, grad_y.size(1), dtype=grad_y.dtype)
        return grad_x.index_add_(0, col.long(), values[:, None] * grad_y[rows])

    monkeypatch.setattr(kernels, "usable", lambda x: x.dtype == torch.float32)
    monkeypatch.setattr(kernels, "csr_rows_spmm", rows_kernel)
    monkeypatch.setattr(kernels, "csr_rows_scatter", rows_scatter)
    batch = sampled([15, 10, 5], num_seeds=64, scale=11)
    blocks = batch.blocks()
    x = torch.randn(batch.nodes.numel(), 8, requires_grad=True)
    for step in ("scatter", "transposes"):
        with DeviceReads() as reads:
            out = x
            for block in blocks:
                out = block.matmul(out, reduce="mean") + out[: block.size(0)]
        assert reads.ops == [], step
        with DeviceReads() as reads:
            out.sum().backward()
        assert reads.ops == [], step
        assert all((block._structure.linked_transpose() is not None) == (step == "transposes") for block in blocks)
