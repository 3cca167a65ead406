"""Choices cached per matrix, measured on the first product where the prediction leaves close
candidates."""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import trials
from ..formats.metcf import MetcfLayout
from . import native
from .. import kernels
from .choice import explain_features
from .device import device_query
from .explanation import Explanation
from .native import MatrixFeatures
from .paths import BUCKETS, CHOICES, n_bucket


class SelectionCache:
    """Choices for one matrix, computed once per (N bucket, dtype, device), and measured on its
    first product where the prediction leaves close candidates (``trials``); explanations built
    only when asked for. A ``Structure`` holds one; the matrix's features (``MatrixFeatures``, in
    the C++ model) come from the host copies its conversion made; a reordered matrix's
    ``rows_share_ratio`` and the size of its grouped layout (``grouped_size``: blocks, nonzeros
    left to the rows kernel and whether every group is one chunk, built with the features) come
    from the ``Structure``, which knows the order."""

    def __init__(self, rows_share_ratio: float = 1.0, grouped_size=None):
        if not isinstance(rows_share_ratio, (int, float)) or not rows_share_ratio >= 0:
            raise ValueError(f"rows_share_ratio must be a non-negative number, got {rows_share_ratio!r}")
        if grouped_size is not None and not callable(grouped_size):
            raise TypeError(f"grouped_size must be callable or None, got {type(grouped_size).__name__}")
        self.rows_share_ratio = float(rows_share_ratio)
        self._grouped_size = grouped_size  # () -> (blocks, rest nnz, one chunk) | None
        self._features: MatrixFeatures | None = None
        self._explanations: dict = {}
        self._by_bucket: dict = {}  # (N bucket, dtype, device) -> path, or the Trial measuring it
        self._measured: dict = {}  # (N bucket, dtype, device) -> path -> median us of its trial
        self._choices: dict = {}  # (n, dtype, device) as the caller gives them -> settled path

    def features(self, layout: MetcfLayout) -> MatrixFeatures:
        """The matrix's features in the C++ model, built once."""
        if self._features is None:
            grouped = self._grouped_size() if self._grouped_size is not None else None
            blocks, rest, one_chunk = grouped or (None, 0, False)
            self._features = MatrixFeatures.of_layout(layout, rows_share_ratio=self.rows_share_ratio,
                                                      grouped_blocks=blocks, grouped_rest_nnz=rest,
                                                      grouped_one_chunk=one_chunk)
        return self._features

    def prepare(self, layout: MetcfLayout) -> None:
        """Build the matrix's features for its choices now rather than on its first product:
        once per matrix, for every N bucket and dtype."""
        self.features(layout)

    def explain(self, layout: MetcfLayout, n: int, dtype: torch.dtype, device=None) -> Explanation:
        """The prediction's explanation, with the measured times and the settled path once the
        choice has been measured."""
        device = torch.device(layout.device if device is None else device)
        key = (n_bucket(n), dtype, device)
        if key not in self._explanations:
            self._explanations[key] = self._outside_graphs(
                lambda: explain_features(self.features(layout), n, dtype, device))
        explanation = self._explanations[key]
        state = self._by_bucket.get(key)
        if isinstance(state, trials.Trial):
            return replace(explanation, reason=f"{explanation.reason}; to be measured: {', '.join(state.paths)}")
        if key in self._measured:
            measured = self._measured[key]
            return replace(
                explanation, choice=state, measured_us=measured,
                reason=f"measured fastest of {', '.join(measured)} on the first product; "
                f"predicted {explanation.choice} ({explanation.reason})",
            )
        return explanation

    def choose(self, layout: MetcfLayout, n: int, dtype: torch.dtype, device=None):
        """(path, trial) of one product with X of ``n`` columns: the ``trials.Trial`` to run it
        through (``measure``) when this product is to measure the choice, else None."""
        # Called on every product: one dict lookup on the caller's own arguments, no bucketing
        # or device normalisation once the choice for an N has settled.
        key = (n, dtype, device)
        choice = self._choices.get(key)
        if choice is not None:
            return choice, None
        normalized = device if isinstance(device, torch.device) else torch.device(layout.device if device is None else device)
        bucket = (n_bucket(n), dtype, normalized)
        state = self._by_bucket.get(bucket)
        if state is None:
            state = self._outside_graphs(self._first_choice, layout, *bucket)
            self._by_bucket[bucket] = state
        if isinstance(state, trials.Trial):
            return state.paths[0], state if trials.allowed(normalized) else None
        self._choices[key] = state
        return state, None

    def possible(self, layout: MetcfLayout, dtype: torch.dtype, device) -> set[str]:
        """The paths products of ``dtype`` on ``device`` may run, at every calibrated N bucket and at
        those products have met: the settled choice, or every path a trial is to measure."""
        device = torch.device(device)
        buckets = set(BUCKETS) | {key[0] for key in self._by_bucket if key[1:] == (dtype, device)}
        paths = set()
        for n in sorted(buckets):
            path, _ = self.choose(layout, n, dtype, device)
            state = self._by_bucket.get((n, dtype, device))
            paths.update(state.paths if isinstance(state, trials.Trial) else (path,))
        return paths

    def measure(self, trial: trials.Trial, product):
        """Run ``trial`` on ``product(path)`` (the caller's product on each path), settle its
        bucket on the fastest path, and return the product."""
        measured, output = trial.run(product)
        self._measured[trial.key] = measured
        self._by_bucket[trial.key] = trials.fastest(measured)
        return output

    def settled(self, n: int, dtype: torch.dtype, device) -> str | None:
        """The path products with these arguments run for good, or None while it is to be measured
        (or before the first product)."""
        state = self._by_bucket.get((n_bucket(n), dtype, torch.device(device)))
        return state if isinstance(state, str) else None

    def _first_choice(self, layout: MetcfLayout, n: int, dtype: torch.dtype, device: torch.device):
        """The predicted path at N bucket ``n``, or the ``trials.Trial`` that measures it against
        its close candidates. Where only "csr" can run (off CUDA, other dtypes) it is the answer
        without asking the model. Otherwise one call into the C++ model: the matrix's side of it
        (features, rows pieces, the paths it may take) was made with its features, the device's
        (prices, launch shapes) is shared by the matrices of its window count
        (``device.device_query``), and torch's modes are read here, so a first choice follows
        them."""
        if not kernels.usable_for(dtype, device):
            return "csr"
        features = self.features(layout)
        query = device_query(device, n, dtype, dtype == torch.float32 and kernels.tf32_allowed(), features.num_windows)
        candidates = features.candidates[torch.are_deterministic_algorithms_enabled()]
        if not trials.allowed(device):
            return native.choose(features, query, candidates)
        choice, costs = native.choose_with_costs(features, query, candidates)
        priced = [p for i, p in enumerate(CHOICES) if candidates >> i & 1 and p in costs]
        paths = trials.shortlist(choice, costs, priced)
        if len(paths) > 1:
            calls = tuple(trials.sample_calls(costs[path]) for path in paths)
            return trials.Trial(paths, calls, key=(n, dtype, device))
        return choice

    @staticmethod
    def _outside_graphs(compute, *args):
        """``compute(*args)``, outside any compiled graph: a layout without host copies is read
        back (a cache hit is traceable). Decorating lazily keeps torch._dynamo out of the import."""
        return torch.compiler.disable(compute)(*args) if torch.compiler.is_compiling() else compute(*args)

    def __len__(self) -> int:
        return len(self._by_bucket.keys() | self._explanations.keys())
