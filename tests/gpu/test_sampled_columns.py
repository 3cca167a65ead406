"""GPU tests of a sampled block's columns sorted by a thread per row (``kernels.sort_row_sources``,
``csrc/sampled_columns.h``): equal to the row-major keys' sort for rows of 0 to the limit's
sources, in both index types, repeated and distinct sources alike; rows past the limit refused;
a sampler's blocks on CUDA take it and equal the sort route's."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def grouped_sources(lengths, num_sources, distinct=True, seed=0):
    """rowptr and int64 sources grouped by row (row i holds lengths[i]), in random order."""
    g = torch.Generator().manual_seed(seed)
    rowptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    rowptr[1:] = torch.tensor(lengths).cumsum(0)
    rows = []
    for length in lengths:
        if distinct:
            rows.append(torch.randperm(num_sources, generator=g)[:length])
        else:
            rows.append(torch.randint(0, 4, (length,), generator=g))
    return rowptr.cuda(), torch.cat(rows).cuda()


def by_keys(rowptr, source):
    """The row-major keys' sort of the same rows: the reference order."""
    target = torch.repeat_interleave(torch.arange(rowptr.numel() - 1, device="cuda"), rowptr.diff())
    return torch.sort(target * (1 << 32) + source).values % (1 << 32)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("distinct", [True, False], ids=["distinct", "repeated"])
def test_rows_of_every_length_up_to_the_limit(kernels, index_dtype, distinct):
    limit = kernels.sorted_row_limit()
    lengths = list(range(limit + 1)) * 3 + [0, 0, 1, limit, limit]
    rowptr, source = grouped_sources(lengths, 5000, distinct)
    col = kernels.sort_row_sources(rowptr.to(index_dtype), source, limit)
    assert col.dtype == index_dtype
    assert torch.equal(col.long(), by_keys(rowptr, source))


def test_empty_matrix_and_rows_past_the_limit(kernels):
    rowptr = torch.zeros(4, dtype=torch.int32, device="cuda")
    assert kernels.sort_row_sources(rowptr, torch.empty(0, dtype=torch.int64, device="cuda"), 0).numel() == 0
    rowptr, source = grouped_sources([2, 3], 10)
    with pytest.raises(RuntimeError, match="longest"):
        kernels.sort_row_sources(rowptr, source, kernels.sorted_row_limit() + 1)


@pytest.mark.parametrize("fanout", [[15, 10, 5], [-1, 3]])
def test_sampled_blocks_on_cuda_equal_the_sort_route(kernels, fanout, monkeypatch):
    """The blocks' columns by the kernel (fan-outs within the limit) or by the keys' sort (a
    full neighbourhood past it), against the keys' sort forced."""
    from torch_tcsparse import conversion
    from torch_tcsparse.loader import NeighborSampler

    g = torch.Generator().manual_seed(0)
    hub = torch.stack([torch.arange(1, 301), torch.zeros(300, dtype=torch.int64)])  # node 0: 300 neighbours
    edge_index = torch.cat([torch.randint(0, 2000, (2, 40_000), generator=g), hub], 1).cuda()
    sampler = NeighborSampler.from_edge_index(edge_index, fanout, 2000)
    batch = sampler.sample(torch.arange(0, 2000, 20, device="cuda"), torch.Generator("cuda").manual_seed(1))
    calls = []
    sort = conversion.kernels.sort_row_sources
    monkeypatch.setattr(conversion.kernels, "sort_row_sources", lambda *args: calls.append(1) or sort(*args))
    ours = batch.blocks()
    assert len(calls) == (1 if -1 not in fanout else 0)
    monkeypatch.setattr(conversion.kernels, "sorts_row_sources", lambda source, longest: False)
    theirs = batch.blocks()
    for a, b in zip(ours, theirs):
        assert torch.equal(a.crow_indices(), b.crow_indices()) and torch.equal(a.col_indices(), b.col_indices())
