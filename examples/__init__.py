"""Examples, run from the repository root as modules: ``python -m examples.gcn.train``."""
