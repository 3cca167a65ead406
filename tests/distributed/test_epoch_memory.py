"""The per-rank memory model (torch_tcsparse.distributed.memory) against the bytes the code
allocates, counted tensor by tensor on the CPU (torch's MemTracker) for emulated ranks of a
small R-MAT graph; and a dropped part frees its arrays without the cycle collector."""
import gc
import types
import weakref

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from benchmarks.distributed.emulation import rank_rows
from benchmarks.distributed.graph import node_features, node_labels, rmat_block
from benchmarks.distributed.training import make_model
from examples.gcn.train_distributed import dropout_seed
from torch_tcsparse.distributed import EmulatedPeers, gcn_part, partition_rows
from torch_tcsparse.distributed.memory import gcn_epoch

ARGS = types.SimpleNamespace(features=24, hidden=40, classes=6, layers=2, dropout=0.5, num_nodes=1 << 10)


def _ranks(parts: int):
    rowptr, col = rmat_block(10, 8, 0, 1 << 10, "cpu")
    partition = partition_rows(rowptr, col, parts, "contiguous")
    rows, requested = rank_rows(partition, rowptr, col)
    for rank in range(parts):
        part = gcn_part(rows[rank][0], rows[rank][1], None, partition.bounds,
                        group=EmulatedPeers(rank, parts, requested[rank]))
        # Its own storage, as on a device (the partition's ids are views of one permutation).
        yield part, partition.nodes(rank).clone()


def _epoch_peak(part, nodes, args) -> int:
    """Bytes at the peak of the second epoch, the graph's arrays not counted."""
    model = make_model(args, torch.device("cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = node_features(nodes, args.features, 0), node_labels(nodes, args.classes, 0)
    part.fix_features(x)

    def epoch(index):
        optimizer.zero_grad()
        out = model(x, part, nodes, dropout_seed(0, index))
        loss = torch.nn.functional.cross_entropy(out, y, reduction="sum") * (2 / args.num_nodes)
        loss.backward()
        optimizer.step()

    epoch(0)
    optimizer.zero_grad()
    tracker = MemTracker()
    # The features' halo rows, received in the first epoch where a product multiplies them,
    # are held by the part.
    fixed = [] if part._fixed[2] is None else [part._fixed[2]]
    tracker.track_external(model, optimizer, x, y, nodes, *fixed)
    with tracker:
        epoch(1)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("widths", [(24, 40, 6), (24, 8, 40), (40, 24, 6)], ids=str)
def test_model_counts_the_epoch_tensors(parts, layers, widths):
    """Every side of each layer (aggregate first or transform first), 2 and 3 ranks."""
    features, hidden, classes = widths
    args = types.SimpleNamespace(**{**vars(ARGS), "layers": layers, "features": features, "hidden": hidden,
                                    "classes": classes})
    for part, nodes in _ranks(parts):
        measured = _epoch_peak(part, nodes, args)
        # On the CPU, dropout hashes in torch operations, not in the GPU's kernel.
        model = gcn_epoch(part.num_own, part.num_halo, sum(part.send_counts), features, hidden, classes, layers,
                          emulated=True, mask_kernel=False)
        # Adam's step counts, one float32 per parameter, live on the host where the rows are on a GPU.
        steps = 4 * 2 * layers
        assert model.peak + steps == measured, (part, model.terms)


def test_model_terms_follow_rows_and_widths():
    memory = gcn_epoch(1000, 100, 50, 128, 256, 16, 2)
    names = {term.name: term for term in memory.terms}
    assert names["x"].size == 1000 * 128 * 4
    assert memory.peak == sum(term.size for term in memory.terms)
    with pytest.raises(ValueError, match="rows"):
        gcn_epoch(-1, 0, 0, 1, 1, 1, 1)


def test_dropped_part_frees_its_arrays_at_once():
    """A part's matrices and their transposes hold no reference cycle: dropping the part frees
    its index arrays without waiting for the cycle collector."""
    part, _ = next(_ranks(2))
    arrays = [weakref.ref(part.interior._structure.col), weakref.ref(part.boundary._structure.layout.block_cols),
              weakref.ref(part.boundary_t._structure.col)]
    enabled = gc.isenabled()
    gc.disable()
    try:
        del part
        assert [array() is None for array in arrays] == [True] * len(arrays)
    finally:
        if enabled:
            gc.enable()
