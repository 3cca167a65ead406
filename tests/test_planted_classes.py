"""graph_data.synthetic.planted_classes: a symmetric canonical graph with power-law degrees, node
features and labels whose signal sits in the neighbourhood, reproducible from its seed."""
import pytest
import torch

from graph_data import synthetic


def test_graph_features_and_labels_have_their_shapes():
    row, col, n, x, y = synthetic.planted_classes(3000, 7, 12, 20.0, seed=1)
    assert n == 3000 and x.shape == (n, 12) and x.dtype == torch.float32
    assert y.dtype == torch.long and int(y.min()) >= 0 and int(y.max()) < 7
    key = row * n + col
    assert bool((key[1:] > key[:-1]).all()) and bool((row != col).all())
    assert torch.equal(torch.sort(col * n + row).values, key), "symmetric"
    degree = torch.bincount(row, minlength=n).float()
    assert 14 < float(degree.mean()) <= 20 and float(degree.max()) > 8 * float(degree.mean())


def test_neighbours_share_the_class_more_than_chance():
    row, col, n, x, y = synthetic.planted_classes(3000, 10, 8, 20.0, homophily=0.5, seed=2)
    same = float((y[row] == y[col]).double().mean())
    assert same == pytest.approx(0.5 + 0.5 / 10, abs=0.05)
    # The features carry the class: each class's mean feature over half of the nodes lies
    # nearest its own mean over the other half.
    half = torch.arange(n) % 2 == 0
    means = [torch.stack([x[(y == c) & part].mean(0) for c in range(10)]) for part in (half, ~half)]
    assert torch.equal(torch.cdist(*means).argmin(1), torch.arange(10))

def test_a_seed_repeats_the_graph():
    a, b, c = (synthetic.planted_classes(500, 4, 3, 6.0, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(p, q) for p, q in zip(a[:2] + a[3:], b[:2] + b[3:]))
    assert not torch.equal(a[4], c[4])


@pytest.mark.parametrize("kwargs, name", [
    ({"num_nodes": 1}, "num_nodes"), ({"num_classes": 2.0}, "num_classes"), ({"num_features": True}, "num_features"),
    ({"homophily": 1.5}, "homophily"), ({"avg_degree": 0}, "avg_degree"), ({"degree_exponent": 1.0},
                                                                           "degree_exponent"),
])
def test_bad_arguments_are_named(kwargs, name):
    arguments = {"num_nodes": 100, "num_classes": 3, "num_features": 4, "avg_degree": 5.0} | kwargs
    with pytest.raises(ValueError, match=name):
        synthetic.planted_classes(**arguments)
