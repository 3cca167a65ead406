"""Graphs for the examples, benchmarks and tests, run from the repository root: real graphs stored
as ``.npz`` adjacency files, synthetic generators, and OGB's on-disk format. The installed library
(``torch_tcsparse``) never imports this package."""
