"""The softmax's row reductions by pieces equal one segment reduction per row, on hub rows, rows
of exactly one piece and empty rows, in every float dtype."""
import pytest
import torch

from torch_tcsparse.nn.attention_graph import row_segments
from torch_tcsparse.nn.segment_softmax import row_reduce


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["max", "sum"])
def test_pieces_then_rows_reduce_as_one_segment(dtype, reduce):
    lengths = torch.tensor([0, 1, 64, 65, 1000, 0, 128, 3])
    x = torch.randn(int(lengths.sum()), 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    segments = row_segments(lengths, piece_edges=64)
    assert int(segments.piece_lengths.max()) <= 64 and segments.pieces_per_row.tolist()[:5] == [1, 1, 1, 2, 16]
    expected = torch.segment_reduce(x.double(), reduce, lengths=lengths, axis=0)
    got = row_reduce(x, reduce, segments)
    assert got.dtype == dtype
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance * 10)
