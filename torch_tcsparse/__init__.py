"""torch_tcsparse: Tensor-Core SpMM for graphs, as a torch.Tensor subclass."""
from . import fused_steps, nn, ops
from .serialization import load
from .tensor import TCSparseTensor

__version__ = "0.1.0"

fused_steps.install()


def spmm(a: TCSparseTensor, x, reduce: str = "sum", path: str = "auto"):
    """Y = A @ X, the products of a row combined by ``reduce`` ("sum", "mean", "max", "min"; see
    ``TCSparseTensor.matmul``). ``path`` forces an engine (``torch_tcsparse.paths.PATHS``):
    "base"/"balanced" (Tensor-Core kernels), "rows" (the CUDA-core CSR kernel), "grouped" (the
    Tensor-Core kernel on 64-row groups), "csr" (torch.sparse), "reference" (ME-TCF block by
    block, the test reference), or "auto" (the selector's choice)."""
    if not isinstance(a, TCSparseTensor):
        raise TypeError(f"spmm expects a TCSparseTensor as first argument, got {type(a).__name__}")
    return a.matmul(x, path=path, reduce=reduce)


__all__ = ["TCSparseTensor", "load", "spmm", "nn", "ops"]
