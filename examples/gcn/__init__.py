"""Full-batch GCN training on OGB and Planetoid graphs with our GCNConv or PyG's."""
