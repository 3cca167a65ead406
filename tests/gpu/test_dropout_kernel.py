"""node_dropout's mask from the Triton kernel is the hash the CPU draws in torch operations, entry
for entry: a node is dropped alike on every device and whichever rank holds it."""
import pytest
import torch

from torch_tcsparse.distributed import dropout_kernel, node_dropout
from torch_tcsparse.distributed.hashing import MASK, hash_ids, mix_

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and dropout_kernel.available("cuda")),
                                reason="needs a CUDA device and Triton")


@pytest.mark.parametrize("rows, channels, p, seed, first_id", [
    (1000, 256, 0.5, 3, 0), (77, 130, 0.3, (1 << 32) - 1, 1 << 40), (5, 1, 0.9, 0, 7),
    (4096, 16, 0.05, 12345, 1 << 33), (33, 129, 0.9999999, 9, 1 << 31)])
def test_kernel_mask_is_the_hash(rows, channels, p, seed, first_id):
    words = hash_ids(torch.arange(rows, device="cuda") + first_id, seed)
    threshold = int(p * (1 << 32))
    kept = torch.empty(rows, channels, dtype=torch.bool, device="cuda")
    dropout_kernel.keep_mask(words, channels, threshold, kept)
    channel = torch.arange(channels, device="cuda")
    assert torch.equal(kept, mix_((words.unsqueeze(1) + channel).bitwise_and_(MASK)) >= threshold)


def test_node_dropout_on_the_gpu_drops_what_the_cpu_drops():
    x = torch.randn(3000, 200, dtype=torch.float64)
    nodes = torch.arange(3000) * 7 + (1 << 30)
    for relu in (False, True):
        on_cpu = node_dropout(x, nodes, 0.4, 5, relu=relu)
        on_gpu = node_dropout(x.cuda(), nodes.cuda(), 0.4, 5, relu=relu).cpu()
        # The same entries dropped; the kept ones scaled alike up to the devices' division.
        assert torch.equal(on_gpu != 0, on_cpu != 0)
        torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-15, atol=0)


def test_keep_mask_checks_its_output():
    words = torch.zeros(4, dtype=torch.long, device="cuda")
    with pytest.raises(ValueError, match=r"out must be a contiguous bool tensor of shape \(4, 8\)"):
        dropout_kernel.keep_mask(words, 8, 1 << 31, torch.empty(8, 4, dtype=torch.bool, device="cuda").t())
