"""torch.compile: the tcsparse op traces with fullgraph=True through its fake implementation, and
code calling A @ X on a TCSparseTensor compiles to the eager result."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.testing import random_dense

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def case():
    dense = random_dense(40, 30, 0.2, seed=0)
    return TCSparseTensor.from_dense(dense), dense, torch.randn(30, 5)


def op_call(a, path):
    """The op on engine ``path``'s indices of ``a``, for CSR-order values, without gradients."""
    s = a._structure
    engine = ENGINES[path]
    tensors, ints = engine.flat(engine.indices(s, a.dtype))

    def product(x, values):
        return torch.ops.tcsparse.spmm(x, values, None, tensors, ints, [], [], [], [], [],
                                       [s.window, s.num_rows, s.num_cols], path)

    return product


@pytest.mark.parametrize("path", ["reference", "csr"])
def test_op_traces_fullgraph_on_plain_tensors(case, path):
    a, dense, x = case
    compiled = torch.compile(op_call(a, path), fullgraph=True)
    torch.testing.assert_close(compiled(x, a.csr.values), dense @ x)


def test_op_traces_fullgraph_with_dynamic_shapes_and_neighbours(case):
    a, dense, x = case
    product = op_call(a, "reference")
    compiled = torch.compile(lambda x, v: torch.relu(product(x, v)) * 2, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (5, 7):
        x = torch.randn(30, n)
        torch.testing.assert_close(compiled(x, a.csr.values), torch.relu(dense @ x) * 2)


PRODUCT_ROUTES = {
    "@": lambda a, x: a @ x,
    "torch.sparse.mm": torch.sparse.mm,
    "torch.matmul": torch.matmul,
    "A.matmul": lambda a, x: a.matmul(x),
}


@pytest.mark.parametrize("route", list(PRODUCT_ROUTES))
def test_function_with_sparse_product_compiles_to_eager_result(case, route):
    a, dense, x = case
    product = PRODUCT_ROUTES[route]
    compiled = torch.compile(lambda a, x: torch.tanh(product(a, x)) + 1)
    torch.testing.assert_close(compiled(a, x), torch.tanh(dense @ x) + 1)


FULLGRAPH_ROUTES = {
    "@": lambda a, x: a @ x,
    "torch.sparse.mm": torch.sparse.mm,
    "torch.matmul": lambda a, x: torch.matmul(a, x),
    "torch.mm": lambda a, x: torch.mm(a, x),
    "A.matmul": lambda a, x: a.matmul(x),
    "Tensor.matmul": lambda a, x: torch.Tensor.matmul(a, x),
}


@pytest.mark.parametrize("route", list(FULLGRAPH_ROUTES))
def test_sparse_product_compiles_fullgraph(case, route):
    a, dense, x = case
    product = FULLGRAPH_ROUTES[route]
    compiled = torch.compile(product, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, x), dense @ x)


def test_compiled_backward_matches_eager(case):
    a, _, x = case
    values = a.csr.values.clone()

    def loss(x, v):
        return (a.with_values(v) @ x).pow(2).sum()

    eager_x, eager_v = x.clone().requires_grad_(), values.clone().requires_grad_()
    loss(eager_x, eager_v).backward()
    compiled_x, compiled_v = x.clone().requires_grad_(), values.clone().requires_grad_()
    torch.compile(loss, backend="aot_eager")(compiled_x, compiled_v).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
    torch.testing.assert_close(compiled_v.grad, eager_v.grad)
