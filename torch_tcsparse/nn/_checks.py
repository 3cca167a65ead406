"""Argument checks shared by the layers and ``gcn_norm``."""
from torch import Tensor


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_channels(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def check_features(x, rows: str, in_channels: int | None = None) -> None:
    """x must be a 2-D tensor [``rows``, channels], of ``in_channels`` channels where given."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        channels = "channels" if in_channels is None else "in_channels"
        raise ValueError(f"x must be a 2-D tensor [{rows}, {channels}], got {shape}")
    if in_channels is not None and x.size(1) != in_channels:
        raise ValueError(f"x has {x.size(1)} channels but the layer expects in_channels={in_channels}")
