"""The layout-price fits of ``benchmarks.layout_prices`` recover prices they were given."""
from pathlib import Path

import pytest

from benchmarks import layout_prices

PRICES_32 = [8.0, 0.4, 0.35, 1.25, 0.0]
PRICES_16 = [6.0, 0.2, 0.3, 1.2, 0.2]
GAIN = {4: 0.7, 2: 0.5}


def record(graph, split, order, blocks, rows, one_chunk, share, given=None):
    r = {"graph": graph, "split": split, "order": order, "rows": rows, "cols": rows, "nnz": 10 * rows,
         "blocks": blocks, "rest_nnz": 0, "one_chunk": one_chunk, "share": share, "l2_bytes": 1 << 20,
         "ns": [32, 128]}
    for value_bytes, prices, name in ((4, PRICES_32, "float32"), (2, PRICES_16, "float16")):
        for n in r["ns"]:
            time_us = sum(p * f for p, f in zip(prices, layout_prices.grouped_features(r, n, value_bytes)))
            r[f"kernel_{name}_{n}"] = r[f"grouped_{name}_{n}"] = time_us
            beyond = max(0.0, 1.0 - r["l2_bytes"] / (rows * n * value_bytes))
            base = 100.0 + rows / 1e3 if given is None else given[f"rows_{name}_{n}"]
            r[f"rows_{name}_{n}"] = base * (1.0 - GAIN[value_bytes] * beyond * (1.0 - share)) if given else base
    return r


def test_fits_recover_the_prices_and_gains():
    records = []
    for i, (rows, blocks, one_chunk) in enumerate([(20_000, 3_000, False), (400_000, 90_000, True),
                                                    (2_000_000, 700_000, False), (100_000, 0, True),
                                                    (800_000, 20_000, True), (50_000, 40_000, False)]):
        split = "unseen" if i == 5 else "fit"
        given = record(f"g{i}", split, "none", blocks, rows, one_chunk, 1.0)
        records += [given, record(f"g{i}", split, "tca", blocks // 2, rows, one_chunk, 0.3 + 0.1 * i, given)]
    for value_bytes, prices in ((4, PRICES_32), (2, PRICES_16)):
        fitted, errors = layout_prices.fit_grouped(records, value_bytes)
        assert fitted == pytest.approx(prices, abs=1e-6)
        assert all(rms < 1e-9 for _, rms, _, _ in errors.values())
        gain, gain_errors = layout_prices.fit_order_gain(records, value_bytes)
        assert gain == pytest.approx(GAIN[value_bytes])
        assert set(gain_errors) == {"fit", "unseen"}


def test_saved_measurements_refit_to_the_shipped_prices(capsys):
    """The measurements in benchmarks/results refit to the prices in csrc/selector_model.cpp."""
    saved = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "layout_prices_h200.csv"
    layout_prices.main(["--from", str(saved)])
    out = capsys.readouterr().out
    assert "fixed_us 7.586, block_ns 0.4151, step_ns 0.3439, sums_us_per_mb 1.248" in out
    assert "fixed_us 5.57, block_ns 0.2145, step_ns 0.3051, sums_us_per_mb 1.229, direct_us_per_mb 0.1794" in out
    assert "rows order gain 0.683" in out and "rows order gain 0.486" in out
