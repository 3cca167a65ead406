"""The memory of one rank's GCN training epoch, tensor by tensor: the tensors that
``DistributedGNN("gcn")`` (examples.gcn.train_distributed), ``DistributedGCNConv``, the halo
exchange, ``node_dropout(relu=True)``, the cross-entropy loss and Adam allocate, in the order they
allocate and free them, each ``rows x width x bytes``. The epoch's peak is the largest sum of the
tensors alive at once; ``EpochMemory.terms`` names those tensors. The graph's own arrays are not
counted here (the part is built before the epoch).

A product's halo buffers are those of ``EmulatedPeers`` and ``Collective`` alike: the rows sent
(``halo_out``) live until the rows received (``halo_in``) have arrived. Gradients of the
parameters and Adam's two moments are held from the first epoch on; their sizes do not depend
on the rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .checks import check_int
from .layers import chunk_rows

# Bytes of the dropout mask and of the kept-entries flags (bool), of node ids and labels (int64).
_BOOL, _INDEX = 1, 8


@dataclass(frozen=True)
class Term:
    """``rows x width`` entries of ``bytes`` each, named by what holds them."""

    name: str
    rows: int
    width: int
    bytes: int

    @property
    def size(self) -> int:
        return self.rows * self.width * self.bytes


@dataclass(frozen=True)
class EpochMemory:
    """``peak``: bytes at the epoch's peak; ``terms``: the tensors alive then."""

    peak: int
    terms: tuple[Term, ...]


class _Tape:
    """Tensors alive, in allocation order, and the largest total seen."""

    def __init__(self):
        self.alive: dict[str, Term] = {}
        self.peak, self.at_peak = -1, ()

    def alloc(self, name: str, rows: int, width: int, size: int) -> None:
        if name in self.alive:
            raise AssertionError(f"{name} allocated twice")
        self.alive[name] = Term(name, rows, width, size)
        total = sum(term.size for term in self.alive.values())
        if total > self.peak:
            self.peak, self.at_peak = total, tuple(self.alive.values())

    def free(self, *names: str) -> None:
        for name in names:
            del self.alive[name]


def _parameter_sizes(sizes: list[int]) -> list[tuple[int, int]]:
    """(rows, width) of every parameter: each layer's weight (out, in) and bias (1, out)."""
    shapes = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        shapes += [(b, a), (1, b)]
    return shapes


def gcn_epoch(rows: int, halo_in: int, halo_out: int, features: int, hidden: int, classes: int, layers: int,
              element_size: int = 4, emulated: bool = False, mask_kernel: bool = True,
              bias_workspace: Callable[[int], int] | None = None) -> EpochMemory:
    """The peak of one training epoch (after the first) of a rank with ``rows`` own rows,
    ``halo_in`` halo rows received and ``halo_out`` rows sent, for the GCN of
    ``features -> hidden x (layers - 1) -> classes`` with dropout (p > 0) and without batch
    normalization; ``emulated``: the exchange of ``EmulatedPeers``, which gathers
    the rows it receives from those it sends through one int64 position per row;
    ``mask_kernel``: ReLU and dropout in one kernel (``dropout_kernel``), as on GPUs; off for a
    run on the CPU. ``bias_workspace(width)``: the bytes that summing the rows' gradient of that
    width into a bias's gradient stages beyond its result (torch's GPU reductions: tens of MB at
    most, whatever the rows; not counted where not given)."""
    for name, value in (("rows", rows), ("halo_in", halo_in), ("halo_out", halo_out)):
        check_int(name, value, 0, None)
    for name, value in (("features", features), ("hidden", hidden), ("classes", classes), ("layers", layers)):
        check_int(name, value, 1, None)
    sizes = [features] + [hidden] * (layers - 1) + [classes]
    e, tape = element_size, _Tape()
    # Held through the epoch: the rank's features, node ids and labels, the parameters and
    # Adam's two moments (the gradients are dropped by ``zero_grad`` and made again below).
    tape.alloc("x", rows, features, e)
    tape.alloc("nodes", rows, 1, _INDEX)
    tape.alloc("labels", rows, 1, _INDEX)
    for index, (r, w) in enumerate(_parameter_sizes(sizes)):
        tape.alloc(f"parameter {index}", r, w, e)
        tape.alloc(f"adam moments {index}", r, w, 2 * e)

    # The first product multiplies the features themselves where the first layer widens: their
    # halo rows were received once, before training (GraphPart.fix_features), and stay.
    fixed_features = sizes[0] < sizes[1]
    if fixed_features:
        tape.alloc("halo 0", halo_in, features, e)

    def product(layer: int, width: int, source: str) -> str:
        """Forward of the distributed product of ``source`` (rows x width); returns its result."""
        received_now = not (layer == 0 and fixed_features)
        if received_now:
            tape.alloc(f"sent {layer}", halo_out, width, e)
            _receive(tape, f"halo {layer}", halo_in, width, e, emulated and halo_out > 0)
            tape.free(f"sent {layer}")
        tape.alloc(f"interior product {layer}", rows, width, e)
        tape.alloc(f"boundary product {layer}", rows, width, e)
        tape.free(f"boundary product {layer}", *([f"halo {layer}"] if received_now else []))
        return f"interior product {layer}"

    current, saved = "x", {}  # saved: per layer, what its Linear keeps for the weight's gradient
    for layer, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if a < b:
            aggregated = product(layer, a, current)
            saved[layer] = aggregated
            tape.alloc(f"linear {layer}", rows, b, e)
            tape.alloc(f"output {layer}", rows, b, e)
            tape.free(f"linear {layer}")
        else:
            saved[layer] = current
            tape.alloc(f"linear {layer}", rows, b, e)
            aggregated = product(layer, b, f"linear {layer}")
            tape.free(f"linear {layer}")
            tape.alloc(f"output {layer}", rows, b, e)
            tape.free(aggregated)
        if current != "x" and current != saved.get(layer):
            tape.free(current)
        if layer == len(sizes) - 2:
            current = f"output {layer}"
            break
        # ReLU and dropout in one step (node_dropout(relu=True)).
        tape.alloc(f"activation {layer}", rows, b, e)
        hashed_rows = min(rows, chunk_rows(b, mask_kernel))
        if mask_kernel:
            # One kernel writes the activation and its nonzero flags, a chunk of rows at a time
            # from the nodes' words (and a shifted copy while they are hashed).
            tape.alloc(f"kept {layer}", rows, b, _BOOL)
            tape.alloc(f"mask node words {layer}", hashed_rows, 1, 2 * _INDEX)
            tape.free(f"mask node words {layer}")
        else:
            tape.alloc(f"dropout mask {layer}", rows, b, _BOOL)
            # The mask's hash, one chunk of rows at a time: the nodes' words, the entries' int64
            # words and a shifted copy.
            tape.alloc(f"mask channels {layer}", 1, b, _INDEX)
            tape.alloc(f"mask node words {layer}", hashed_rows, 1, _INDEX)
            tape.alloc(f"mask hash {layer}", hashed_rows, b, 2 * _INDEX)
            tape.free(f"mask hash {layer}", f"mask node words {layer}", f"mask channels {layer}",
                      f"dropout mask {layer}")
            tape.alloc(f"kept {layer}", rows, b, _BOOL)
        tape.free(f"output {layer}")
        current = f"activation {layer}"
    last = len(sizes) - 2
    # The loss: log-softmax (kept for its backward), the summed loss.
    tape.alloc("log-softmax", rows, classes, e)
    tape.alloc("loss", 1, 1, e)
    # Backward, from the loss's seed gradient (a scalar).
    tape.alloc("seed gradient", 1, 1, e)
    tape.alloc("loss gradient", rows, classes, e)
    tape.alloc("log-softmax gradient", rows, classes, e)
    tape.free("loss gradient", "log-softmax")
    grad = "log-softmax gradient"
    for layer in range(last, -1, -1):
        a, b = sizes[layer], sizes[layer + 1]
        first = layer == 0
        tape.alloc(f"bias gradient {layer}", 1, b, e)
        if bias_workspace is not None:
            tape.alloc(f"bias gradient workspace {layer}", 1, bias_workspace(b), 1)
            tape.free(f"bias gradient workspace {layer}")
        if a < b:
            # Linear's backward: the weight's gradient from the saved product; the input's
            # gradient only where the input needs one (not the features).
            tape.alloc(f"weight gradient {layer}", b, a, e)
            if first:
                tape.free(grad, saved[layer])
                break
            tape.alloc(f"product gradient {layer}", rows, a, e)
            tape.free(grad, saved[layer])
            grad = _product_backward(tape, layer, a, rows, halo_in, halo_out, e, f"product gradient {layer}",
                                     emulated)
        else:
            grad = _product_backward(tape, layer, b, rows, halo_in, halo_out, e, grad, emulated)
            tape.alloc(f"weight gradient {layer}", b, a, e)
            if first:
                tape.free(grad)
                break
            tape.alloc(f"input gradient {layer}", rows, a, e)
            tape.free(grad, saved[layer])
            grad = f"input gradient {layer}"
        # The ReLU-dropout step's backward, into the previous layer's output.
        tape.alloc(f"activation gradient {layer - 1}", rows, a, e)
        tape.free(grad, f"kept {layer - 1}")
        grad = f"activation gradient {layer - 1}"
    return EpochMemory(tape.peak, tape.at_peak)


def _receive(tape: _Tape, name: str, count: int, width: int, e: int, gathered: bool) -> None:
    """The buffer of ``count`` received rows (and the positions an emulated receive gathers them by)."""
    if gathered:
        tape.alloc(f"{name} positions", count, 1, _INDEX)
    tape.alloc(name, count, width, e)
    if gathered:
        tape.free(f"{name} positions")


def _product_backward(tape: _Tape, layer: int, width: int, rows: int, halo_in: int, halo_out: int, e: int,
                      grad: str, emulated: bool) -> str:
    """The distributed product's backward: the halo's gradients (boundary transpose), sent back
    to their owners while the interior transpose multiplies, added to the own rows'."""
    tape.alloc(f"halo gradient {layer}", halo_in, width, e)
    _receive(tape, f"returned gradient {layer}", halo_out, width, e, emulated and halo_in > 0)
    tape.free(f"halo gradient {layer}")
    tape.alloc(f"own gradient {layer}", rows, width, e)
    tape.free(f"returned gradient {layer}", grad)
    return f"own gradient {layer}"
