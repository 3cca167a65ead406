"""The small models the compile tests trace: a training step's graph is what they pin down."""
from __future__ import annotations

import torch

from torch_tcsparse.nn import GCNConv


class TwoLayerGCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(8, 16, normalize=False)
        self.conv2 = GCNConv(16, 3, normalize=False)

    def forward(self, x, adj):
        return self.conv2(self.conv1(x, adj).relu(), adj)
