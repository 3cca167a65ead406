"""``benchmarks.distributed --rebalance``: the time weight of a row fitted to the ranks' compute."""
import pytest

from benchmarks import distributed as benchmark
from benchmarks.distributed.rebalance import fitted_time_weight


def test_fit_recovers_the_ranks_costs():
    """Ranks that cost 0.1 per nonzero and 30 per row give a time weight of 300."""
    nnz, rows = [116_000_000, 16_500_000, 40_000_000], [1_830_000, 2_360_000, 2_000_000]
    compute = [0.1 * n + 30 * r for n, r in zip(nnz, rows)]
    assert fitted_time_weight(nnz, rows, compute) == 300


def test_fit_declines_what_the_ranks_cannot_tell():
    assert fitted_time_weight([10, 20], [1, 2], [5.0, 10.0]) is None, "rows proportional to nonzeros"
    assert fitted_time_weight([100, 10], [1, 2], [1.0, 5.0]) is None, "a negative cost per nonzero"


def test_rebalance_needs_ranks(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--rebalance", "--emulate", "2"])
    assert "--rebalance" in capsys.readouterr().err
