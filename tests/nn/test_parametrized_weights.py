"""Training GCNConv whose Linear is pruned, weight-normalized or spectral-normalized, step by step
against PyG's GCNConv under the same reparametrization. These make the weight inside the
Linear's call (a forward pre-hook or a parametrization), so the layer must not read
``lin.weight`` ahead of that call."""
import pytest
import torch
from torch.nn.utils import parametrizations, prune

from torch_tcsparse.nn import GCNConv

pyg_nn = pytest.importorskip("torch_geometric.nn")

REPARAMETRIZATIONS = {
    "prune": lambda lin: prune.l1_unstructured(lin, "weight", amount=0.3),
    "weight_norm": lambda lin: parametrizations.weight_norm(lin),
    "legacy_weight_norm": lambda lin: torch.nn.utils.weight_norm(lin),
    "spectral_norm": lambda lin: parametrizations.spectral_norm(lin),
    "legacy_spectral_norm": lambda lin: torch.nn.utils.spectral_norm(lin),
}
STEPS = 4


def graph(num_nodes=40, num_edges=200):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g)


def training(layer, x, edge_index, steps):
    """Outputs of each step of SGD on a fixed loss, and the final parameters and buffers (PyG's
    state dict also holds the computed ``lin.weight``)."""
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    coefficients = torch.linspace(-1, 1, x.size(0) * layer.out_channels, dtype=x.dtype).view(x.size(0), -1)
    outputs = []
    for _ in range(steps):
        optimizer.zero_grad()
        out = layer(x, edge_index)
        (out * coefficients).sum().backward()
        optimizer.step()
        outputs.append(out.detach())
    return outputs, {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


@pytest.mark.parametrize("name", REPARAMETRIZATIONS)
def test_training_matches_pyg(name):
    # A first layer (features without gradient, in_channels < out_channels), the case where W's
    # gradient would otherwise come from the narrower product adj @ x.
    x = torch.randn(40, 8, dtype=torch.float64)
    edge_index = graph()
    torch.manual_seed(1)
    ours = GCNConv(8, 16).double()
    theirs = pyg_nn.GCNConv(8, 16).double()
    theirs.load_state_dict(ours.state_dict())
    for layer in (ours, theirs):
        torch.manual_seed(2)  # spectral norm draws its power-iteration start at random
        REPARAMETRIZATIONS[name](layer.lin)
    ours_outputs, ours_state = training(ours, x, edge_index, STEPS)
    pyg_outputs, pyg_state = training(theirs, x, edge_index, STEPS)
    for step, (mine, expected) in enumerate(zip(ours_outputs, pyg_outputs)):
        torch.testing.assert_close(mine, expected, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {step}: {m}")
    assert ours_state.keys() == pyg_state.keys()
    for key in ours_state:
        torch.testing.assert_close(ours_state[key], pyg_state[key], rtol=1e-10, atol=1e-10)


def test_hooked_linear_is_called():
    # A forward hook on lin changes what the layer computes: the layer must call lin.
    layer = GCNConv(4, 8)
    layer.lin.register_forward_hook(lambda module, inputs, output: output * 0)
    out = layer(torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]]))
    assert torch.equal(out, layer.bias.expand(5, -1))
    out.sum().backward()
    assert torch.count_nonzero(layer.lin.weight.grad) == 0
