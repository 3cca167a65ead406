"""torch.compile takes a TCSparseTensor as an input of the compiled function (a traceable wrapper
subclass): every product route compiles with fullgraph=True to the eager result, forward and
backward, and torch._dynamo.explain finds no graph break, a whole GCN training step included."""
import pytest
import torch
from compiled_models import TwoLayerGCN

from torch_tcsparse import TCSparseTensor, flattening
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.testing import random_dense

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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


@pytest.mark.parametrize("route", list(ROUTES))
def test_values_gradient_with_matrix_input(case, route):
    """A matrix passed in whose values require grad (a learnable adjacency) gives them the eager
    gradient: the compiled function's gradient of the matrix reaches its values."""
    a, x = case
    product = ROUTES[route]

    def run(fn):
        weights = a.csr.values.detach().clone().requires_grad_()
        matrix = a.with_values(weights * 1.5)
        x_in = x.clone().requires_grad_()
        y = fn(matrix, x_in)
        (y.tanh() * torch.arange(y.shape[1], dtype=y.dtype)).sum().backward()
        return y.detach(), x_in.grad, weights.grad

    eager = run(product)
    compiled = run(torch.compile(product, fullgraph=True, backend="aot_eager"))
    assert compiled[2] is not None
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got, expected)


def test_values_gradient_with_matrix_input_under_inductor(case):
    a, x = case
    weights = a.csr.values.detach().clone().requires_grad_()
    torch.compile(lambda a, x: a @ x, fullgraph=True)(a.with_values(weights), x).sum().backward()
    expected = a.csr.values.detach().clone().requires_grad_()
    (a.with_values(expected) @ x).sum().backward()
    torch.testing.assert_close(weights.grad, expected.grad)


@pytest.mark.parametrize("route", list(ROUTES))
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


def gcn_case():
    torch.manual_seed(0)
    num_nodes = 24
    edge_index = torch.randint(0, num_nodes, (2, 80))
    adj = TCSparseTensor.from_edge_index(edge_index, torch.rand(80), num_nodes=num_nodes)
    return adj, torch.randn(num_nodes, 8), torch.randint(0, 3, (num_nodes,))


def training_functions(model, optimizer):
    """A training step as two compiled functions: forward and loss, whose backward is the
    compiled graph's, and the optimizer's step. ``loss.backward()`` between them is no graph of
    its own: Dynamo breaks the graph at ``Tensor.backward()`` for every model."""
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
        # torch.optim breaks its own graph around the step (to run it without grad).
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
    loss_of, optimizer_step = training_functions(model, optimizer)
    forward = torch._dynamo.explain(loss_of)(x, adj, labels)
    assert forward.graph_break_count == 0, forward.break_reasons
    assert forward.graph_count == 1
    loss_of(x, adj, labels).backward()
    step = torch._dynamo.explain(optimizer_step)()
    assert step.graph_break_count == 0, step.break_reasons
    assert step.graph_count == 1


def test_whole_training_step_compiles_around_backward():
    """One compiled function holding zero_grad, forward, backward and step: it runs (its one
    graph break is Dynamo's at Tensor.backward()) with the eager losses."""
    def losses(compile_step):
        adj, x, labels = gcn_case()
        model = TwoLayerGCN()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, adj, labels):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x, adj), labels)
            loss.backward()
            optimizer.step()
            return loss.detach()

        step = torch.compile(step, backend="aot_eager") if compile_step else step
        return [step(x, adj, labels) for _ in range(3)]

    torch.testing.assert_close(losses(True), losses(False))


class LearnedWeightsGCN(TwoLayerGCN):
    """The GCN on the graph's edges with weights it learns: the matrix is built inside the step."""

    def __init__(self, adj):
        super().__init__()
        self.weights = torch.nn.Parameter(adj.csr.values.detach().clone())

    def forward(self, x, adj):
        return super().forward(x, adj.with_values(self.weights))


@pytest.mark.parametrize("model_class", [TwoLayerGCN, LearnedWeightsGCN])
def test_whole_training_step_with_compiled_autograd_matches_eager(model_class):
    """The whole step compiled with compiled autograd on (read when ``torch.compile`` is called):
    the backward is a compiled graph of its own, and losses and parameters after a few Adam
    steps are the eager ones, learned edge weights included."""
    from torch._dynamo.utils import counters

    def train(compile_step):
        adj, x, labels = gcn_case()
        model = model_class(adj) if model_class is LearnedWeightsGCN else model_class()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

        def step(x, adj, labels):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x, adj), labels)
            loss.backward()
            optimizer.step()
            return loss.detach()

        if compile_step:
            with torch._dynamo.config.patch(compiled_autograd=True):
                step = torch.compile(step, backend="aot_eager")
        losses = [step(x, adj, labels) for _ in range(4)]
        return losses, [p.detach().clone() for p in model.parameters()]

    counters.clear()
    losses, parameters = train(True)
    assert counters["compiled_autograd"]["captures"] >= 1
    eager_losses, eager_parameters = train(False)
    torch.testing.assert_close(losses, eager_losses)
    torch.testing.assert_close(parameters, eager_parameters)


def forced_rows(monkeypatch):
    """Products of float32 choose the "rows" path, as the selector may on a GPU."""
    from torch_tcsparse.selector.cache import SelectionCache

    monkeypatch.setattr(flattening.kernels, "usable_for", lambda dtype, device: dtype == torch.float32)
    monkeypatch.setattr(SelectionCache, "choose", lambda self, layout, n, dtype, device=None: ("rows", None))


def rows_split_of(structure) -> list[int]:
    """The split rows a traced copy of ``structure`` hands the rows engine (float32 X)."""
    tensors, context = flattening.flatten(structure, torch.float32, False)
    copy = flattening.unflatten(context, tensors)
    return ENGINES["rows"].indices(copy, torch.float32).pieces.split_rows.tolist()


def test_flattening_carries_the_rows_split_for_the_current_mode(monkeypatch):
    forced_rows(monkeypatch)
    split_rows = TCSparseTensor.from_dense(torch.ones(4, 600))
    context = flattening.flatten(split_rows._structure, torch.float32, False)[1]
    assert rows_split_of(split_rows._structure) == [0, 1, 2, 3]
    torch.use_deterministic_algorithms(True)
    try:
        assert rows_split_of(split_rows._structure) == []
        unsplit_context = flattening.flatten(split_rows._structure, torch.float32, False)[1]
    finally:
        torch.use_deterministic_algorithms(False)
    assert unsplit_context != context
    assert flattening.flatten(split_rows._structure, torch.float32, False)[1] == context


def test_matrix_with_learnable_values_links_them_and_detaches(case):
    a, x = case
    weights = a.csr.values.detach().clone().requires_grad_()
    matrix = a.with_values(weights)
    assert matrix.requires_grad and not a.requires_grad
    (matrix @ x).sum().backward()
    torch.testing.assert_close(weights.grad, x.sum(1)[a.csr.col.long()])
    detached = matrix.detach()
    assert isinstance(detached, TCSparseTensor) and not detached.requires_grad
    torch.testing.assert_close(detached @ x, a @ x)


VALUE_READS = {
    "values()": lambda a, x: a.values()[:, None] * x[a.col_indices().long()],
    "csr": lambda a, x: a.csr.values[:, None] * x[a.col_indices().long()],
    "to(dtype)": lambda a, x: a.to(torch.float32) @ x.float(),
    "t()": lambda a, x: a.t() @ torch.cat([x, x])[:a.shape[0]],
}


@pytest.mark.parametrize("read", list(VALUE_READS))
def test_other_reads_of_learnable_values_carry_the_gradient(case, read):
    a, x = case
    fn = VALUE_READS[read]

    def gradient(f):
        weights = a.csr.values.detach().clone().requires_grad_()
        f(a.with_values(weights), x).double().square().sum().backward()
        return weights.grad

    torch.testing.assert_close(gradient(torch.compile(fn, backend="aot_eager")), gradient(fn))


def test_matrix_input_that_gets_no_gradient_leaves_its_values_none(case):
    """A compiled function that reads only the index arrays of a matrix with learnable values
    gives the matrix no gradient: backward reaches X, and the values get none (not a dense zero
    matrix read as the matrix's gradient)."""
    a, x = case
    fn = lambda a, x: x[a.col_indices().long()] * a.crow_indices()[1:].sum()

    def gradients(f):
        weights = a.csr.values.detach().clone().requires_grad_()
        x_ = x.detach().clone().requires_grad_()
        f(a.with_values(weights), x_).square().sum().backward()
        return weights.grad, x_.grad

    compiled_weights, compiled_x = gradients(torch.compile(fn, backend="aot_eager"))
    eager_weights, eager_x = gradients(fn)
    assert compiled_weights is None and eager_weights is None
    torch.testing.assert_close(compiled_x, eager_x)
