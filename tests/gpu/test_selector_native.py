"""The selector's C++ model on a GPU: a product's first choice (one call once the matrix has met
its N bucket, dtype and torch's modes) is the choice ``A.explain`` gives, under every TF32 and
deterministic mode; the launch shapes come from the compiled kernels; the features come with the
conversion."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, selector

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_tensor(seed: int, n: int, nnz: int, skewed: bool) -> TCSparseTensor:
    g = torch.Generator().manual_seed(seed)
    row, col = torch.randint(0, n, (nnz,), generator=g), torch.randint(0, n, (nnz,), generator=g)
    if skewed:  # hub rows: windows of many blocks, where the balanced kernel may win
        row = (row.double() ** 3 / n**2).long()
    return TCSparseTensor.from_coo(row, col, torch.rand(nnz, generator=g), shape=(n, n)).cuda()


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_first_choice_is_the_explained_choice(kernels, precision, deterministic):
    previous = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        for seed, (n, nnz, skewed) in enumerate([(3000, 30000, False), (20000, 400000, True), (500, 4000, True)]):
            a = random_tensor(seed, n, nnz, skewed)
            for dtype in DTYPES:
                typed = a.to(dtype)
                cache, layout = typed._structure.selection, typed._structure.layout
                for width in selector.BUCKETS:
                    path, trial = cache.choose(layout, width, dtype, torch.device("cuda"))
                    assert trial is None
                    assert path == typed.explain(width).choice
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def test_explanations_use_the_kernels_launch_shapes_and_the_choice_runs(kernels):
    a = random_tensor(1, 3000, 30000, False)
    props = torch.cuda.get_device_properties(a.device)
    windows = a._structure.layout.num_windows
    for width in (32, 128):
        explanation = a.explain(width)
        for path in ("base", "balanced"):
            resident = kernels.occupancy(path, width, torch.float32, windows)
            assert explanation.slots[path] == props.multi_processor_count * resident
        assert explanation.features["column_slices"] == kernels.column_slices("base", width, torch.float32, windows)
        x = torch.randn(3000, width, device="cuda")
        expected = a.matmul(x, path="csr")
        got = a.matmul(x, path=explanation.choice)
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max()))


@pytest.mark.parametrize("built_on", ["cuda", "cpu"])
def test_the_features_come_with_the_conversion_on_a_gpu(kernels, built_on):
    """A matrix converted on (or moved to) the GPU has its C++ features before its first
    product, which then pays only the choice; one on the CPU leaves them to its products, and so
    does a transpose (a backward pass runs it on the forward's path)."""
    g = torch.Generator().manual_seed(3)
    n = 3000
    row, col = torch.randint(0, n, (30000,), generator=g), torch.randint(0, n, (30000,), generator=g)
    a = TCSparseTensor.from_coo(row.to(built_on), col.to(built_on), torch.rand(30000, generator=g).to(built_on),
                                shape=(n, n))
    if built_on == "cpu":
        assert a._structure.selection._features is None
        a = a.cuda()
    cache = a._structure.selection
    assert cache._features is not None and len(cache) == 0
    x = torch.randn(n, 64, device="cuda")
    torch.testing.assert_close(a @ x, a.to_dense() @ x, rtol=1e-2, atol=1e-2)
    assert cache.settled(64, torch.float32, x.device) == a.explain(64).choice
    assert a._structure.transposed().selection._features is None
