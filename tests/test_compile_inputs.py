"""What a TCSparseTensor carries into a compiled function (``flattening``): every flattened array
is a graph input that each call of the compiled code unwraps and guards, so a matrix carries what
its products can use. The counts are pinned here, so that they cannot grow unseen."""
import pickle

import pytest
import torch
from compiled_models import TwoLayerGCN
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from torch_tcsparse import TCSparseTensor

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def directed_graph(num_nodes=24, edges=80):
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, num_nodes, (2, edges), generator=generator)
    return TCSparseTensor.from_edge_index(edge_index, torch.rand(edges, generator=generator), num_nodes=num_nodes)


def counting_backend(counts: dict):
    """aot_eager, recording the placeholders of the forward and backward graphs it compiles."""
    def compiler(kind):
        def compile_graph(gm, example_inputs):
            counts[kind] = sum(node.op == "placeholder" for node in gm.graph.nodes)
            return make_boxed_func(gm.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))


def test_a_compiled_gcn_step_takes_in_the_csr_and_gathers_of_the_matrix_and_its_transpose():
    """Forward and loss of a 2-layer GCN on the CPU ("csr" path): 4 parameters, X and the labels,
    and the matrix's values with 8 index arrays: its CSR and its transpose's (dX), and both
    layouts' gathers that put the values in the transpose's order. No other engine's indices,
    no SDDMM layout (the values need no gradient)."""
    torch.manual_seed(0)
    adj = directed_graph()
    x, labels = torch.randn(24, 8), torch.randint(0, 3, (24,))
    model = TwoLayerGCN()
    counts = {}
    compiled = torch.compile(lambda x, a, y: torch.nn.functional.cross_entropy(model(x, a), y), fullgraph=True,
                             backend=counting_backend(counts))
    loss = compiled(x, adj, labels)
    loss.backward()
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(model(x, adj), labels))
    assert len(adj.__tensor_flatten__()[0]) == 1 + 8
    assert counts["forward"] == 4 + 2 + 1 + 8


def test_the_plan_follows_the_matrix_not_the_grad_mode():
    """torch's runtime wrappers unwrap the inputs under modes of their own (an inference graph
    runs without grad): the matrix flattens alike under every grad mode, and a detached matrix
    as the matrix did."""
    adj = directed_graph()
    names, context = adj.__tensor_flatten__()
    with torch.no_grad():
        assert adj.__tensor_flatten__() == (names, context)
    weights = adj.csr.values.detach().clone().requires_grad_()
    learnable = adj.with_values(weights)
    assert learnable.detach().__tensor_flatten__() == learnable.__tensor_flatten__()
    # An inference graph (no input requires grad) called with grad enabled, and without.
    compiled = torch.compile(lambda a, x: a @ x, fullgraph=True)
    x = torch.ones(24, 2)
    torch.testing.assert_close(compiled(adj, x), adj.to_dense() @ x)
    with torch.no_grad():
        torch.testing.assert_close(compiled(adj, x), adj.to_dense() @ x)


def test_learnable_values_add_the_layout_their_gradient_reads():
    adj = directed_graph()
    weights = adj.csr.values.detach().clone().requires_grad_()
    # The 9 kernel arrays of the layout, one of them (csr_gather) travelling already.
    assert len(adj.with_values(weights).__tensor_flatten__()[0]) == 1 + 8 + 8


def test_a_symmetric_pattern_shares_its_arrays_with_its_transpose():
    adj = directed_graph()
    row, col = adj.csr.row_indices(), adj._structure.col.long()
    symmetric = TCSparseTensor.from_coo(torch.cat([row, col]), torch.cat([col, row]), shape=(24, 24))
    # Its CSR, one layout gather (our csr_gather is the transpose's) and the transpose's link
    # (its own inverse).
    assert len(symmetric.__tensor_flatten__()[0]) == 1 + 2 + 2


def test_the_context_pickles_as_its_stable_hash():
    """A compiled-graph cache entry names the matrix: no index array is copied to the host for
    it, and the entry loads back to this process's matrix of the same hash."""
    _, context = directed_graph().__tensor_flatten__()
    data = pickle.dumps(context)
    assert len(data) < 300
    assert pickle.loads(data) is context


def test_a_named_path_that_does_not_travel_is_refused():
    """On the CPU only the CSR travels: a compiled product naming the reference is refused at
    tracing, with the paths that do."""
    adj = directed_graph()
    compiled = torch.compile(lambda a, x: a.matmul(x, path="reference"), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="does not travel"):
        compiled(adj, torch.ones(24, 2))
