"""An ogbn-products-shaped node classification task generated in memory on any device: 2.45M
nodes by default, about 51 neighbours a node with a power-law spread, 100 features, 47 classes
and OGB's split sizes (8% train, 1.6% valid, the rest test), the class planted in the
neighbourhood (``graph_data.synthetic.planted_classes``). No files and no ogb: made on a GPU in
seconds, the same for every run of a seed."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graph_data import synthetic

NUM_NODES = 2_449_029
NUM_CLASSES = 47
NUM_FEATURES = 100
AVG_DEGREE = 50.5
SPLIT_FRACTIONS = {"train": 0.08, "valid": 0.016}


class Accuracy:
    """ogb's ``Evaluator`` for accuracy, without ogb: ``eval({"y_true", "y_pred"})`` -> ``{"acc"}``."""

    eval_metric = "acc"

    def eval(self, result: dict) -> dict:
        y_true, y_pred = result["y_true"].view(-1), result["y_pred"].view(-1)
        return {"acc": float((y_true.to(y_pred.device) == y_pred).double().mean())}


@dataclass
class ProductsTask:
    """The fields of ``examples.gcn.data.NodeTask`` that node classification reads."""

    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    split: dict
    num_outputs: int = NUM_CLASSES
    metric: str = "acc"
    evaluator: Accuracy = field(default_factory=Accuracy)


def products_task(num_nodes: int = NUM_NODES, seed: int = 0, device="cpu") -> ProductsTask:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an int >= 2, got {num_nodes!r}")
    row, col, num_nodes, x, y = synthetic.planted_classes(num_nodes, NUM_CLASSES, NUM_FEATURES, AVG_DEGREE,
                                                          seed=seed, device=device)
    order = torch.randperm(num_nodes, generator=torch.Generator(device=device).manual_seed(seed + 1),
                           device=device)
    num_train = max(1, int(SPLIT_FRACTIONS["train"] * num_nodes))
    num_valid = max(1, int(SPLIT_FRACTIONS["valid"] * num_nodes))
    split = {"train": order[:num_train], "valid": order[num_train: num_train + num_valid],
             "test": order[num_train + num_valid:]}
    # (row, col) is symmetric: as edge_index, row 0 the source.
    return ProductsTask(x, y, torch.stack([col, row]), split)
