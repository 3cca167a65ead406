"""GPU memory of an emulated rank: a dropped part gives its memory back at once, and the peak of a
training epoch is the one the memory model (torch_tcsparse.distributed.memory) counts, given the
bias gradients' workspaces measured here, up to cuBLAS's workspace and the allocator's rounding."""
import gc
import types

import pytest
import torch

from benchmarks.distributed.emulation import rank_rows
from benchmarks.distributed.graph import node_features, node_labels, rmat_block
from benchmarks.distributed.training import epochs, make_model
from torch_tcsparse.distributed import EmulatedPeers, dropout_kernel, gcn_part, partition_rows
from torch_tcsparse.distributed.memory import gcn_epoch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCALE = 16
# epochs=0: each call of ``epochs`` runs its warm-up epochs only.
ARGS = types.SimpleNamespace(features=128, hidden=256, classes=16, layers=2, dropout=0.5, num_nodes=1 << SCALE,
                             epochs=0)
# The tensors alive before an epoch starts, which the model counts in its peak (parameters, their
# gradients and Adam's state weigh a few hundred KB, within the tolerance; "halo 0": the features'
# halo rows, received in the first epoch and held by the part).
PERSISTENT = ("x", "nodes", "labels", "parameter", "adam moments", "halo 0")
# Kernel workspaces (cuBLAS's among them) and 512-byte rounding, against hundreds of MB of rows.
TOLERANCE = 0.05


def reduction_workspace(rows: int, width: int) -> int:
    """Bytes that summing a ``rows x width`` float32 gradient over its rows (a bias's gradient)
    asks of the allocator beyond its result: torch's reduction stages partial sums in global
    memory (at this test's size, about half of the epoch's peak)."""
    grad = torch.empty(rows, width, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    total = grad.sum(0)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before - total.untyped_storage().nbytes()


def _ranks(parts: int):
    rowptr, col = rmat_block(SCALE, 16, 0, 1 << SCALE, "cpu")
    partition = partition_rows(rowptr, col, parts, "contiguous")
    rows, requested = rank_rows(partition, rowptr, col)
    for rank in range(parts):
        part = gcn_part(rows[rank][0].cuda(), rows[rank][1].cuda(), None, partition.bounds,
                        group=EmulatedPeers(rank, parts, requested[rank]))
        yield part, partition.nodes(rank).cuda()


def test_dropped_part_frees_its_memory_at_once():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    part, nodes = next(_ranks(2))
    del nodes
    assert torch.cuda.memory_allocated() > before
    enabled = gc.isenabled()
    gc.disable()
    try:
        del part
        assert torch.cuda.memory_allocated() == before
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("parts", [2, 4])
def test_epoch_peak_is_the_model(parts):
    device = torch.device("cuda")
    for part, nodes in _ranks(parts):
        x, y = node_features(nodes, ARGS.features, 0), node_labels(nodes, ARGS.classes, 0)
        model = make_model(ARGS, device)
        part.fix_features(x)
        # First epochs (cuBLAS's workspace, the selector's choices), then the measured ones.
        epochs(model, x, y, part, nodes, ARGS, device, parts)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        epochs(model, x, y, part, nodes, ARGS, device, parts)
        peak = torch.cuda.max_memory_allocated() - before
        predicted = gcn_epoch(part.num_own, part.num_halo, sum(part.send_counts), ARGS.features, ARGS.hidden,
                              ARGS.classes, ARGS.layers, emulated=True,
                              mask_kernel=dropout_kernel.available(device),
                              bias_workspace=lambda width: reduction_workspace(part.num_own, width))
        persistent = sum(t.size for t in predicted.terms if t.name.startswith(PERSISTENT))
        measured = peak + persistent
        assert abs(measured - predicted.peak) <= TOLERANCE * predicted.peak, (
            part, measured, predicted.peak, [(t.name, t.size) for t in predicted.terms])
        del part, x, y, model
