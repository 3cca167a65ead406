"""Where data is read from and where anything derived from it is written.

- ``data_root()``: the folder of real graphs (``graphs/*.npz``, ``ogb/``, ``planetoid/``), read
  only: ``$TCSPARSE_DATA``, else ``data/`` in the repository.
- ``cache_dir()``: the one folder the project writes to (generated datasets, downloads, the
  ``processed/`` files of PyG and ogb): ``$TCSPARSE_CACHE``, else ``~/.cache/torch_tcsparse``
  (``$XDG_CACHE_HOME`` honoured).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    return Path(os.environ.get("TCSPARSE_DATA", REPOSITORY / "data"))


def cache_dir() -> Path:
    if "TCSPARSE_CACHE" in os.environ:
        return Path(os.environ["TCSPARSE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_tcsparse"


def loader_mirror(source) -> Path:
    """A folder in the cache that stands for the dataset folder ``source``: every entry of
    ``source`` appears in it as a symbolic link, except ``processed/``, the mirror's own.

    PyG's and ogb's loaders write ``processed/`` next to the raw files they read; pointed at the
    mirror, they read ``source`` and write only into the cache, so a folder given for reading is
    never modified, whatever its permissions."""
    source = Path(source).resolve()
    if not source.is_dir():
        raise ValueError(f"source must be a dataset folder, got {source}")
    digest = hashlib.sha1(str(source).encode()).hexdigest()[:12]
    mirror = cache_dir() / "mirrors" / f"{source.name}-{digest}" / source.name
    mirror.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        link = mirror / entry.name
        if entry.name != "processed" and not link.is_symlink():
            link.symlink_to(entry)
    return mirror
