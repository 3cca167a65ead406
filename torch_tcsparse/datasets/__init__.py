"""Graph loaders: the npz adjacency files of ../shared/data/graphs and synthetic generators."""
