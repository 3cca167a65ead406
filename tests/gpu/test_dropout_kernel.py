"""node_dropout's kernels on the GPU draw the hash the CPU draws in torch operations, entry for
entry (a node is dropped alike on every device and whichever rank holds it), and the ReLU-dropout
kernel gives the numbers of torch's own operations on the GPU."""
import pytest
import torch

from torch_tcsparse.distributed import dropout_kernel, node_dropout
from torch_tcsparse.distributed.hashing import MASK, hash_ids, mix_

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and dropout_kernel.available("cuda")),
                                reason="needs a CUDA device and Triton")

CASES = [(1000, 256, 0.5, 3, 0), (77, 130, 0.3, (1 << 32) - 1, 1 << 40), (5, 1, 0.9, 0, 7),
         (4096, 16, 0.05, 12345, 1 << 33), (33, 129, 0.9999999, 9, 1 << 31)]


def hashed_mask(words, channels, threshold):
    channel = torch.arange(channels, device=words.device)
    return mix_((words.unsqueeze(1) + channel).bitwise_and_(MASK)) >= threshold


@pytest.mark.parametrize("rows, channels, p, seed, first_id", CASES)
def test_kernel_mask_is_the_hash(rows, channels, p, seed, first_id):
    words = hash_ids(torch.arange(rows, device="cuda") + first_id, seed)
    threshold = int(p * (1 << 32))
    kept = torch.empty(rows, channels, dtype=torch.bool, device="cuda")
    dropout_kernel.keep_mask(words, threshold, kept)
    assert torch.equal(kept, hashed_mask(words, channels, threshold))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rows, channels, p, seed, first_id", CASES)
def test_relu_dropout_is_torchs_operations(rows, channels, p, seed, first_id, dtype):
    nodes = torch.arange(rows, device="cuda") + first_id
    x = torch.randn(rows, channels, device="cuda").to(dtype).requires_grad_()
    out = node_dropout(x, nodes, p, seed, relu=True)
    mask = hashed_mask(hash_ids(nodes, seed), channels, int(p * (1 << 32)))
    expected = torch.relu(x.detach()).mul_(mask).div_(1.0 - p)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, grad.mul(expected != 0).div_(1.0 - p))
    assert not x.grad[expected == 0].isnan().any()


def test_node_dropout_on_the_gpu_drops_what_the_cpu_drops():
    x = torch.randn(3000, 200, dtype=torch.float64)
    nodes = torch.arange(3000) * 7 + (1 << 30)
    for relu in (False, True):
        on_cpu = node_dropout(x, nodes, 0.4, 5, relu=relu)
        on_gpu = node_dropout(x.cuda(), nodes.cuda(), 0.4, 5, relu=relu).cpu()
        # The same entries dropped; the kept ones scaled alike up to the devices' division.
        assert torch.equal(on_gpu != 0, on_cpu != 0)
        torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-15, atol=0)


def test_kernels_check_their_tensors():
    words = torch.zeros(4, dtype=torch.long, device="cuda")
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.bool tensor of 4 rows"):
        dropout_kernel.keep_mask(words, 1 << 31, torch.empty(8, 4, dtype=torch.bool, device="cuda").t())
    x = torch.zeros(4, 8, device="cuda")
    kept = torch.empty(4, 8, dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 tensor of 4 rows"):
        dropout_kernel.relu_dropout(x, words, 1 << 31, torch.ones(1, device="cuda"), x.half(), kept)
    with pytest.raises(ValueError, match=r"scale must hold one element, got 2"):
        dropout_kernel.relu_dropout(x, words, 1 << 31, torch.ones(2, device="cuda"), torch.empty_like(x), kept)


@pytest.mark.parametrize("relu", [False, True])
def test_kernels_over_several_chunks_of_rows(monkeypatch, relu):
    from torch_tcsparse.distributed import layers
    x = torch.randn(100, 40, device="cuda")
    nodes = torch.arange(100, device="cuda") * 3 + 11
    whole = node_dropout(x, nodes, 0.4, 5, relu=relu)
    monkeypatch.setattr(layers, "KERNEL_CHUNK_ROWS", 7)
    assert torch.equal(node_dropout(x, nodes, 0.4, 5, relu=relu), whole)
    mask = hashed_mask(hash_ids(nodes, 5), 40, int(0.4 * (1 << 32)))
    assert torch.equal(whole != 0, mask & ((x > 0) if relu else (x != 0)))
