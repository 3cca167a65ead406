"""What every run of the benchmark shares: the model, its epochs, clocks and memory peaks."""
from __future__ import annotations

import gc
import time

import torch
import torch.nn.functional as F

from examples.gcn.train_distributed import DistributedGNN, dropout_seed
from torch_tcsparse.distributed.model import product_widths

# Exchange configurations: (overlap, halo dtype).
CONFIGS = {"plain": (False, None), "overlap": (True, None), "plain-bf16": (False, torch.bfloat16),
           "overlap-bf16": (True, torch.bfloat16)}
# Warm-up epochs before the timed ones.
WARMUP = 2


class Clock:
    """Wall time of host-side sections; on a GPU, the device time between CUDA events."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pairs, self.host = [], 0.0

    def wrap(self, fn):
        def timed(*args):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = fn(*args)
                end.record()
                self.pairs.append((start, end))
                return result
            start = time.perf_counter()
            result = fn(*args)
            self.host += time.perf_counter() - start
            return result
        return timed

    def seconds(self) -> float:
        synchronize(self.device)
        return self.host + sum(start.elapsed_time(end) for start, end in self.pairs) / 1e3


class ExchangeMeter:
    """Wraps a part's halo exchanges: the time the rank spends in them outside the products
    (starting each, then waiting for its rows: with overlap, only the wait the interior product
    did not hide), and the width of every exchanged block."""

    def __init__(self, part, device):
        self.clock, self.widths = Clock(device), []
        self.part = part
        part.gather_halo = self._metered(part.gather_halo)
        part.scatter_halo = self._metered(part.scatter_halo)

    def detach(self) -> None:
        """Gives the part its own methods back."""
        del self.part.gather_halo, self.part.scatter_halo

    def _metered(self, fn):
        start = self.clock.wrap(fn)

        def metered(tensor, *rest):
            self.widths.append(tensor.size(1))
            pending = start(tensor, *rest)
            pending.wait = self.clock.wrap(pending.wait)
            return pending
        return metered


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    # A phase's tensors caught in a reference cycle would otherwise count against the next one.
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def allocated_gb(device) -> float:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def make_model(args, device):
    torch.manual_seed(0)
    return DistributedGNN("gcn", args.features, args.hidden, args.classes, args.layers, args.dropout).to(device)


def epochs(step_model, x, y, part, nodes, args, device, world: int, progress=None) -> tuple[list[float], torch.Tensor]:
    """Seconds of each of WARMUP + ``args.epochs`` epochs, and each epoch's loss as this rank adds
    to it (``global_losses`` sums them over the ranks). ``progress``, where given, is called with
    a line after the first epoch's forward and backward passes (inside that warm-up epoch) and
    after every epoch (outside its time)."""
    optimizer = torch.optim.Adam(step_model.parameters(), lr=0.01)
    times, losses = [], []
    for epoch in range(WARMUP + args.epochs):
        synchronize(device)
        start = time.perf_counter()
        step_model.train()
        optimizer.zero_grad()
        out = step_model(x, part, nodes, dropout_seed(0, epoch))
        if progress is not None and epoch == 0:
            progress("epoch 0: forward done")
        # DDP averages gradients over the ranks: each rank's sum is scaled to the global mean times P.
        loss = F.cross_entropy(out, y, reduction="sum") * (world / args.num_nodes)
        loss.backward()
        if progress is not None and epoch == 0:
            progress("epoch 0: backward done")
        optimizer.step()
        losses.append(loss.detach() / world)
        # Not alive through the next epoch's forward pass.
        del out, loss
        synchronize(device)
        times.append(time.perf_counter() - start)
        if progress is not None:
            progress(f"epoch {epoch}: {times[-1]:.2f} s")
    return times, torch.stack(losses)


def loss_curve(losses: torch.Tensor) -> str:
    """The mean loss over every node per epoch, as the CSV keeps it: what P GPUs and one GPU
    should agree on (up to the order of float sums)."""
    return ";".join(f"{float(v):.6f}" for v in losses.cpu())


def products_time(matrix, args, device) -> float:
    """Seconds of the sparse products of one epoch on the whole graph (A is symmetric: the
    backward products multiply by its transpose, built and kept like a part's)."""
    transpose = matrix.t()
    total = 0.0
    for width, backward in product_widths(args.features, args.hidden, args.classes, args.layers):
        dense = torch.randn(matrix.shape[1], width, device=device)
        for operand in (matrix, transpose) if backward else (matrix,):
            operand @ dense
            synchronize(device)
            start = time.perf_counter()
            for _ in range(5):
                operand @ dense
            synchronize(device)
            total += (time.perf_counter() - start) / 5
    return total


def partition_weights(method: str, weights: tuple[int, ...]) -> tuple[int, ...]:
    """The row weights a partitioner balances: METIS and contiguous ranges take the first (time)."""
    return weights if method in ("auto", "multilevel") else weights[:1]


def imbalances_for(imbalances: tuple[float, ...], weights: tuple[int, ...]) -> tuple[float, ...]:
    """One imbalance per row weight: the i-th of ``imbalances``, its last for every later weight."""
    return tuple(imbalances[min(index, len(imbalances) - 1)] for index in range(len(weights)))


def network(args) -> tuple[int, int, int, int]:
    """The GCN's (features, hidden, classes, layers), as the memory model takes them."""
    return args.features, args.hidden, args.classes, args.layers


def parameter_bytes(args, element_size: int = 4) -> int:
    sizes = [args.features] + [args.hidden] * (args.layers - 1) + [args.classes]
    return element_size * sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
