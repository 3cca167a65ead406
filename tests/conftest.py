"""Suite-wide settings: modest hypothesis runs, fresh random inputs per run (the seed is printed
in the header so a failure can be replayed), and one CPU thread for the tiny-graph folders."""
import os
import random
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, settings

# Property tests build a layout per example; 25 examples keep the suite within its time budget
# on 2 CPU cores. TCSPARSE_HYPOTHESIS_EXAMPLES raises it for a deeper local run.
settings.register_profile(
    "tcsparse",
    max_examples=int(os.environ.get("TCSPARSE_HYPOTHESIS_EXAMPLES", 25)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("tcsparse")

SEED = int(os.environ.get("TCSPARSE_SEED", random.randrange(2**31)))

# The GCN layer, example and reordering tests run on graphs of a few thousand nodes: one intra-op thread is
# faster than a team there, and far faster when the CI cores are shared (an OpenMP team stalls
# whenever one of its threads is descheduled).
SINGLE_THREAD_FOLDERS = ("nn", "examples", "reorder")


def pytest_report_header(config):
    return f"torch seed: {SEED} (set TCSPARSE_SEED={SEED} to replay this run)"


def pytest_configure(config):
    """Datasets generated, downloaded or processed during the run go to a folder of the run's own:
    no test reads what an example or an earlier run left in the user's cache, nor writes there."""
    config.add_cleanup(_private_cache(os.environ.get("TCSPARSE_CACHE")))


def _private_cache(previous):
    folder = tempfile.TemporaryDirectory(prefix="tcsparse-cache-")
    os.environ["TCSPARSE_CACHE"] = folder.name

    def restore():
        if previous is None:
            os.environ.pop("TCSPARSE_CACHE", None)
        else:
            os.environ["TCSPARSE_CACHE"] = previous
        folder.cleanup()
    return restore


@pytest.fixture(autouse=True)
def seeded_torch():
    torch.manual_seed(SEED)


@pytest.fixture(autouse=True)
def single_thread_for_tiny_graphs(request):
    if request.node.path.parent.name not in SINGLE_THREAD_FOLDERS:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_dynamo():
    """Compiled code and its guards from other tests dropped before and after the test, and the
    compiled-graph caches off: a cached graph would hide a recompilation and count towards the
    compiler's recompile limit, and tests that force a path behind the selector's back would
    reuse each other's graphs (the caches key a matrix by what the selector chooses from)."""
    import torch._functorch.config
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()
