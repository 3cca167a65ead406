"""Public SpMM kernels timed next to ours, each built from its own repository cloned into
``third_party/`` (git-ignored): nothing of their code is kept in this repository."""
