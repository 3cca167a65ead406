"""torch.compile takes a TCSparseTensor as an input of the compiled function (a traceable wrapper
subclass): every product route compiles with fullgraph=True to the eager result, forward and
backward, and torch._dynamo.explain finds no graph break, a whole GCN training step included."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import GCNConv
from torch_tcsparse.testing import random_dense


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def case():
    dense = random_dense(40, 30, 0.2, seed=0).double()
    generator = torch.Generator().manual_seed(0)
    return TCSparseTensor.from_dense(dense), torch.randn(30, 5, dtype=torch.float64, generator=generator)


ROUTES = {
    "@": lambda a, x: a @ x,
    "torch.sparse.mm": torch.sparse.mm,
    "torch.matmul": torch.matmul,
    "torch.mm": torch.mm,
    "A.matmul": lambda a, x: a.matmul(x),
    "A.matmul mean": lambda a, x: a.matmul(x, reduce="mean"),
    "A.matmul max": lambda a, x: a.matmul(x, reduce="max"),
    "torch.sparse.mm min": lambda a, x: torch.sparse.mm(a, x, "amin"),
}


def forward_and_grads(fn, a, x):
    """fn(A, V, X) and the gradients of a loss on it for X and for the values V."""
    values = a.csr.values.detach().clone().requires_grad_()
    x = x.detach().clone().requires_grad_()
    y = fn(a, values, x)
    (y.tanh() * torch.arange(y.shape[1], dtype=y.dtype)).sum().backward()
    return y.detach(), x.grad, values.grad


def assert_compiled_matches_eager(fn, a, x):
    eager = forward_and_grads(fn, a, x)
    compiled = forward_and_grads(torch.compile(fn, fullgraph=True, backend="aot_eager"), a, x)
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("route", list(ROUTES))
def test_product_compiles_fullgraph_with_matrix_input(case, route):
    a, x = case
    product = ROUTES[route]
    eager = product(a, x)
    compiled_x = x.clone().requires_grad_()
    y = torch.compile(product, fullgraph=True, backend="aot_eager")(a, compiled_x)
    torch.testing.assert_close(y, eager)
    eager_x = x.clone().requires_grad_()
    product(a, eager_x).tanh().sum().backward()
    y.tanh().sum().backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)


@pytest.mark.parametrize("route", list(ROUTES))
def test_values_gradient_with_matrix_built_inside(case, route):
    a, x = case
    product = ROUTES[route]
    assert_compiled_matches_eager(lambda a, values, x: product(a.with_values(values), x), a, x)


@pytest.mark.parametrize("route", ["@", "torch.sparse.mm"])
def test_explain_finds_no_graph_break(case, route):
    a, x = case
    explanation = torch._dynamo.explain(ROUTES[route])(a, x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_recompiles_for_another_matrix_with_its_own_result(case):
    a, x = case
    b = TCSparseTensor.from_dense(random_dense(40, 30, 0.3, seed=1).double())
    compiled = torch.compile(lambda a, x: a @ x, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, x), a.to_dense() @ x)
    torch.testing.assert_close(compiled(b, x), b.to_dense() @ x)


class TwoLayerGCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(8, 16, normalize=False)
        self.conv2 = GCNConv(16, 3, normalize=False)

    def forward(self, x, adj):
        return self.conv2(self.conv1(x, adj).relu(), adj)


def gcn_case():
    torch.manual_seed(0)
    num_nodes = 24
    edge_index = torch.randint(0, num_nodes, (2, 80))
    adj = TCSparseTensor.from_edge_index(edge_index, torch.rand(80), num_nodes=num_nodes)
    return adj, torch.randn(num_nodes, 8), torch.randint(0, 3, (num_nodes,))


def training_functions(model, optimizer):
    """A training step as two compiled functions: forward and loss (its backward is the compiled
    graph's), and the optimizer's step, which torch.optim itself splits into graphs (it breaks
    the graph to switch gradients off), whatever the model."""
    def loss_of(x, adj, labels):
        return torch.nn.functional.cross_entropy(model(x, adj), labels)

    return loss_of, optimizer.step


def trained_parameters(backend):
    adj, x, labels = gcn_case()
    model = TwoLayerGCN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_of, optimizer_step = training_functions(model, optimizer)
    if backend is not None:
        loss_of = torch.compile(loss_of, fullgraph=True, backend=backend)
        optimizer_step = torch.compile(optimizer_step, backend=backend)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = loss_of(x, adj, labels)
        loss.backward()
        optimizer_step()
        losses.append(loss.detach())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_gcn_training_matches_eager(backend):
    eager_losses, eager_parameters = trained_parameters(None)
    losses, parameters = trained_parameters(backend)
    torch.testing.assert_close(losses, eager_losses)
    torch.testing.assert_close(parameters, eager_parameters)


def test_explain_finds_no_graph_break_in_gcn_training_step():
    adj, x, labels = gcn_case()
    model = TwoLayerGCN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_of, _ = training_functions(model, optimizer)
    forward = torch._dynamo.explain(loss_of)(x, adj, labels)
    assert forward.graph_break_count == 0, forward.break_reasons
    assert forward.graph_count == 1
