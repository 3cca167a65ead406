"""The partitioner's floating-point running sums (``weighted_graph.ordered_cumsum``): torch.cumsum
itself on the CPU and for integers, and off the CPU a scan whose additions are grouped by position
alone (torch.cumsum on CUDA groups a float tensor's additions by which blocks finish first). The
partitioner runs through that scan (forced here on the CPU) and gives one partition run after
run."""
import sys

import pytest
import torch

from benchmarks.distributed.graph import rmat_block
from torch_tcsparse.distributed import partition_rows, weighted_graph
from torch_tcsparse.distributed.weighted_graph import fixed_order_cumsum, ordered_cumsum, within_group


def hillis_steele(values: list[float]) -> list[float]:
    """The scan's grouping, in Python floats: round k adds the entry 2**k before."""
    current, shift = list(values), 1
    while shift < len(current):
        current = current[:shift] + [current[i] + current[i - shift] for i in range(shift, len(current))]
        shift *= 2
    return current


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 9, 100])
def test_fixed_order_scan_is_a_running_sum(n):
    integers = torch.randint(-1000, 1000, (n, 3), generator=torch.Generator().manual_seed(n))
    assert torch.equal(fixed_order_cumsum(integers), torch.cumsum(integers, 0))
    # Small integers in float64 add exactly in any grouping.
    assert torch.equal(fixed_order_cumsum(integers.double()), torch.cumsum(integers.double(), 0))


def test_fixed_order_scan_groups_its_additions_by_position():
    values = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) / 7
    scanned = fixed_order_cumsum(values)
    assert scanned.tolist() == hillis_steele(values.tolist())
    assert not torch.equal(scanned, torch.cumsum(values, 0)), "another grouping than the sequential sum's"
    assert torch.allclose(scanned, torch.cumsum(values, 0), rtol=1e-12, atol=0)


def test_cpu_and_integers_keep_torch_cumsum(monkeypatch):
    values = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) / 7
    assert torch.equal(ordered_cumsum(values), torch.cumsum(values, 0))
    segment = torch.arange(1000) // 10
    starts = torch.arange(0, 1000, 10)
    cumulative = torch.cumsum(values, 0)
    expected = cumulative - (cumulative[starts] - values[starts])[segment]
    assert torch.equal(within_group(values, segment, starts), expected)
    # Integers add exactly in any order: torch.cumsum on every device.
    monkeypatch.setattr(weighted_graph, "_adds_in_order", lambda device: False)
    monkeypatch.setattr(weighted_graph, "fixed_order_cumsum", None)
    integers = torch.randint(0, 1 << 40, (1000, 2), generator=torch.Generator().manual_seed(2))
    assert torch.equal(ordered_cumsum(integers), torch.cumsum(integers, 0))


# The partitioner's running sums of floats: singletons' shares, rebalancing's removed excess, and
# the price of room (the loss per weight freed, running over the staying nodes).
SUMS = ("_merge_singletons", "_chosen_moves", "_room_price")


def test_partitioner_through_the_fixed_order_scan(monkeypatch):
    """Every float running sum the partitioner takes goes through the fixed-order scan where the
    device's cumsum does not add in order; the partitions are valid, balanced and repeat."""
    callers = set()
    scan = weighted_graph.fixed_order_cumsum

    def traced(values):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name not in SUMS:
            frame = frame.f_back
        callers.add((frame.f_code.co_name if frame else None, values.dtype))
        return scan(values)

    monkeypatch.setattr(weighted_graph, "_adds_in_order", lambda device: False)
    monkeypatch.setattr(weighted_graph, "fixed_order_cumsum", traced)
    rowptr, col = rmat_block(12, 16, 0, 1 << 12, "cpu")
    first = partition_rows(rowptr, col, 3, row_weight=(0, 64))
    assert callers == {(name, torch.float64) for name in SUMS}
    assert torch.equal(partition_rows(rowptr, col, 3, row_weight=(0, 64)).order, first.order)
    degree = rowptr.diff()
    weights = torch.stack([degree + 1, degree + 65], 1)
    per_part = torch.stack([weights[first.nodes(r)].sum(0) for r in range(3)])
    assert bool((per_part <= torch.ceil(weights.sum(0).double() * 1.03 / 3)).all())
    assert first.cut_nonzeros(rowptr, col) < partition_rows(rowptr, col, 3, "contiguous").cut_nonzeros(rowptr, col)
