"""Kernel selector: simulate the GPU's thread-block scheduling and pick the fastest SpMM path.

DTC-SpMM (ASPLOS'24, section 4.5.2) decides between its base kernel (one thread block per row
window) and its balanced kernel (fixed chunks of TC blocks, partial rows combined with atomics)
by simulating how thread blocks land on the SMs: the approximation ratio AR is the makespan of
base divided by the makespan of balanced, and balanced runs when AR exceeds a threshold (1.2,
fitted on an RTX 4090). We keep that rule, with the threshold calibrated per GPU family, and add
a cost model in microseconds for every path so that the chosen Tensor-Core kernel is also ranked
against ``"csr"`` (torch.sparse, cuSPARSE): ``A @ X`` should never be meaningfully slower than it.

The launch shapes simulated are those of ``csrc/metcf_spmm.cuh``, whose unit of work is a warp
(the scheduling slots are ``SMs x resident warps per SM``):

- base: one warp per (window, column slice), the slices of a window adjacent, issued in window
  order; the hardware gives each warp to the first slot that frees (list scheduling; warps are
  in fact placed four at a time, as thread blocks, which the model ignores). A warp costs
  ``block_units + tc_blocks of its window`` units;
- balanced: a persistent grid of ``G = min(items, slots)`` warps over (slice, chunk) items,
  slice-major; warp i takes the contiguous items [i * per, (i + 1) * per) and handles the
  consecutive chunks of one window as one segment: it costs ``segment_units`` per segment, its TC
  blocks, and ``split_units`` per segment whose window crosses its range boundary (the atomic
  adds). All warps are co-resident, so the makespan is exact. A small kernel first zeroes the
  rows of empty and cut windows (``zero_us`` per row);
- a kernel's time is ``launch_us + (unit_us + miss_unit_us * miss) * work / slots + tail_us *
  (makespan - work / slots)``: the evenly spread work, then the imbalance
  tail; ``miss`` is the share of X beyond L2, which prices gathers that go
  to memory (uniform 1M: X is 10x L2) against those served by L2 (the small real graphs);
- csr: ``launch_us + nnz_us * nnz + row_us * rows + max_row_us * longest row + miss_nnz_us * nnz
  * miss`` (the gather of X per nonzero, the write of Y per row, the row-split imbalance of the
  longest row);
- rows (our CUDA-core CSR kernel): the same form with its own constants, its row term counting
  the warps that take the rows (``native.rows_per_warp``: at small N a warp packs several short
  rows, one per slot of lanes), the longest row capped at the matrix's piece (``csr_rows.split_piece_nnz``: longer rows are split), plus
  ``split_launch_us`` when any row is split: the pieces of a split row add into float32 sums
  with atomics and the last to arrive (or, in large launches, a finishing kernel) rounds them
  into Y; it decides between rows and csr on small power-law graphs, where they are close;
- grouped (the Tensor-Core kernel on the grouped layout): a cost per block, per warp-step and
  per byte of the fp32 sums it adds into (rows x N: zeroed, then added to atomically; a 16-bit Y
  the kernel writes itself costs its own bytes), fitted on an H200 (in ``csrc/selector_model.h``),
  plus the rows time of the nonzeros the layout leaves to the rows kernel (``grouped_rest_nnz``);
  the layout's split itself is chosen by the same prices when it is built (``grouped_split``);
- every path costs at least its ``floor_us``: the host-side cost of one call (Python, dispatch,
  launch), which is what a call on a small graph costs when calls run back to back;
- a reordered matrix runs the rows path in its order; the order's ``rows_share_ratio``
  (``reorder.locality.share_ratio``: distinct columns per group of rows against the given order)
  scales the rows time by ``1 - gain * beyond * (1 - ratio)``, ``beyond`` the share of X that
  L2 cannot hold (an order only moves the rows of X that miss it), the gain
  (``rows_order_gain`` in ``csrc/selector_model.h``, per element size) fitted on the "fit"
  families in their tca and community orders (docs/DECISIONS.md).

On a GPU, resident blocks per SM and column slices come from the compiled kernels
(``kernels.occupancy(path, n)``, ``kernels.column_slices(path, n)``); without one (tests, CPU
explanations) from the documented defaults. Not modelled: the deterministic balanced variant
(``torch.use_deterministic_algorithms``: a grid-stride loop and a workspace sum) and the cost of
3xTF32 when TF32 is disallowed; the calibration is measured with TF32, as the SpMM benchmark.
For float16/bfloat16 the launch shapes are those of the 16-bit kernels (wider column slices,
which also depend on the window count), the bytes moved count 2-byte elements, and the constants
are the dtype's own buckets where the calibration has them (``dtype_buckets``), else float32's.

Constants live in ``calibration/<family>.json`` (one per GPU family, ``default.json`` when the
family has none), per N bucket; ``python -m torch_tcsparse.selector.calibrate`` fits them on the
measurements ``benchmarks/selector.py`` makes.

The model is C++ (``csrc/selector_model.cpp``), the only one: built on first use with the system's
C++ compiler into a small library (``build``, no torch or CUDA headers, so it runs without a GPU)
and reached through ``native`` (ctypes). A choice must cost at most half an SpMM: the matrix's
features are handed over once (the conversion's per-window prefix sums, ``MetcfLayout.host_counts``,
kept by reference: nothing is read from the device and no O(windows) prefix is recomputed), with
all of the matrix's side of a choice that does not depend on N (its rows pieces, the paths it may
take); the device's side at an N bucket (the calibration's constants, the kernels' launch shapes)
is built once per process and shared by matrices (``device.device_query``); then each first
choice at an N bucket is one call of four arguments, since ctypes' conversion of each argument,
not the model, is most of a first choice on a small graph. The model simulates a kernel's
schedule only where the choice depends on it: a kernel costs at least its launch, its evenly
spread work and its heaviest window (base) or warp (balanced), and base at most its even share
plus its heaviest window (Graham's bound on list scheduling); where "rows" (or "grouped") beats
the kernels' lower bounds they cannot be chosen.
A launch that fits in one wave (every warp resident at once, the small graphs) has a closed form,
exact. Beyond one wave, list scheduling is exact up to a few jobs per slot, and a fluid estimate
beyond, in a few O(windows) passes; the balanced grid is exact, from the prefix sums at its warp
boundaries. ``explain`` prices every path and reads out why.

Choice: the calibration's ``kernel_rule`` picks the kernel, either DTC-SpMM's (balanced when AR >
``ar_threshold``) or the kernel with the lower predicted time (the rule that fitted the measured
oracle better on that GPU); it runs unless ``"csr"`` is predicted faster, or the kernel is
predicted less than its ``csr_margin`` faster (a calibrated safety margin per kernel: a wrong
kernel must not cost more than cuSPARSE; the balanced kernel's extra zeroing launch and atomics
make its prediction the less certain on small graphs). Where it may run, ``"rows"`` then replaces
that choice when predicted at least ``rows_margin`` faster than it. Where other paths are predicted
within ``trials.MARGIN`` of that choice, ``SelectionCache`` measures them on the matrix's first
product and keeps the fastest (``trials``).
"""
from __future__ import annotations
from .cache import SelectionCache
from .calibration import CALIBRATION_DIR, DEFAULT_L2_BYTES, SCALE_WITH_N, Calibration, csr_margins, dtype_name
from .choice import explain, choose, grouped_split, predict_costs, predicted_choice, rank, runnable_paths
from .device import DeviceModel, device_model, gpu_family
from .explanation import Explanation
from .native import MatrixFeatures, default_column_slices
from .paths import BUCKETS, CALIBRATED_CHOICES, CHOICES, KERNEL_CHOICES, n_bucket

__all__ = [
    "BUCKETS",
    "CALIBRATION_DIR",
    "CALIBRATED_CHOICES",
    "CHOICES",
    "Calibration",
    "DEFAULT_L2_BYTES",
    "DeviceModel",
    "Explanation",
    "KERNEL_CHOICES",
    "MatrixFeatures",
    "SCALE_WITH_N",
    "SelectionCache",
    "choose",
    "csr_margins",
    "default_column_slices",
    "device_model",
    "dtype_name",
    "explain",
    "gpu_family",
    "grouped_split",
    "n_bucket",
    "predict_costs",
    "predicted_choice",
    "rank",
    "runnable_paths",
]
