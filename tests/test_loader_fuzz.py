"""The loader fuzzer: saved matrices with a crafted state or damaged bytes (tests/saved_files.py)
must load, and then multiply as their own CSR does in float64, or raise ValueError; either way
within a memory bound of a few times what the file holds. Every example derives from the suite's
seed (TCSPARSE_SEED replays a run); TCSPARSE_FUZZ_EXAMPLES raises the count for a deeper run."""
import io
import os

import numpy as np
import pytest
import torch
from memory import PeakGrowth

import saved_files
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.paths import CPU_CSR_DTYPES
from torch_tcsparse.serialization import load
from torch_tcsparse.testing import assert_matches_reference, coo_to_dense

# A warning on the way (a cast that drops an imaginary part, say) is a silent change of the file.
pytestmark = pytest.mark.filterwarnings("error")

EXAMPLES = int(os.environ.get("TCSPARSE_FUZZ_EXAMPLES", 120))
# Peak memory a load may add: MEMORY_FACTOR times the file's unpacked size, plus what torch's
# allocator and a small matrix's layout take whatever the file (far below any array the fuzzer
# claims: LARGEST_CLAIM entries). A file that does hold a long int32 rowptr is rebuilt through
# several int64 arrays per row at once (the conversion's temporaries): over ten times its bytes.
MEMORY_FACTOR = 16
MEMORY_SLACK = 16 * 2**20
# Beyond this many elements the dense float64 reference is not built (a wide claimed shape).
REFERENCE_ELEMENTS = 2**16


@pytest.fixture(autouse=True)
def one_thread():
    """Matrices of a few dozen rows: one intra-op thread, as for the tiny-graph folders (a team
    of threads stalls on every small op when the CI cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def attempt(read, data: bytes):
    """What ``read`` makes of ``data``: the loaded object, or the ValueError it raised, and the
    peak memory it added."""
    with PeakGrowth() as peak:
        try:
            outcome = read(io.BytesIO(data))
        except ValueError as error:
            outcome = error
    bound = MEMORY_FACTOR * saved_files.logical_size(data) + MEMORY_SLACK
    assert peak.bytes <= bound, f"peak memory rose by {peak.bytes} bytes, above {bound} for a {len(data)}-byte file"
    return outcome


def check_loaded(matrix, rng: np.random.Generator) -> None:
    """A loaded matrix multiplies as its own canonical CSR does, on every CPU path."""
    assert isinstance(matrix, TCSparseTensor), f"loaded a {type(matrix).__name__}"
    csr = matrix.csr
    assert matrix.nnz == csr.values.numel() == int(csr.rowptr[-1])
    if csr.num_rows * csr.num_cols > REFERENCE_ELEMENTS:
        return
    values = csr.values
    if not bool(torch.isfinite(values).all()) or (values.numel() and float(values.abs().max()) > 2**10):
        # Flipped bytes of the values: the structure is what remains to check, with tame values.
        values = torch.from_numpy(rng.integers(-4, 5, values.numel()) / 4).to(values.dtype)
        matrix = matrix.with_values(values)
    dense = coo_to_dense(csr.row_indices(), csr.col, values, (csr.num_rows, csr.num_cols))
    assert torch.equal(matrix.to_dense().double(), dense)
    x = torch.from_numpy(rng.standard_normal((csr.num_cols, 3))).to(values.dtype)
    paths = ["reference", "auto"] + (["csr"] if values.dtype in CPU_CSR_DTYPES else [])
    for path in paths:
        assert_matches_reference(matrix.matmul(x, path=path), dense, x)


def example_rng(number: int) -> np.random.Generator:
    return np.random.default_rng([torch.initial_seed(), number])


def test_crafted_states_load_correctly_or_raise_value_error():
    for number in range(EXAMPLES):
        rng = example_rng(number)
        state = saved_files.state_of(saved_files.random_matrix(rng))
        edits = rng.choice(saved_files.STATE_EDITS, size=int(rng.integers(1, 3)))
        for edit in edits:
            state = edit(rng, state)
        data = saved_files.save(saved_files.Crafted(state))
        context = f"example {number} (seed {torch.initial_seed()}), edits {[edit.__name__ for edit in edits]}"
        try:
            outcome = attempt(lambda f: torch.load(f, weights_only=True), data)
            if not isinstance(outcome, ValueError):
                check_loaded(outcome, rng)
        except Exception as error:
            raise AssertionError(f"{context}: {type(error).__name__}: {error}") from error


def test_damaged_archives_load_correctly_or_raise_value_error():
    for number in range(EXAMPLES):
        rng = example_rng(number)
        matrix = saved_files.random_matrix(rng)
        data = saved_files.save({"adjacency": matrix, "weight": torch.ones(3)} if rng.random() < 0.3 else matrix)
        edit = saved_files.BYTE_EDITS[rng.integers(len(saved_files.BYTE_EDITS))]
        data = edit(rng, data)
        context = f"example {number} (seed {torch.initial_seed()}), edit {edit.__name__}"
        try:
            outcome = attempt(load, data)
            # Flipped bytes may rename the dict's keys or turn its entries into other objects.
            found = outcome.values() if isinstance(outcome, dict) else [outcome]
            for matrix in (item for item in found if isinstance(item, TCSparseTensor)):
                check_loaded(matrix, rng)
        except Exception as error:
            raise AssertionError(f"{context}: {type(error).__name__}: {error}") from error


@pytest.mark.parametrize("edit", saved_files.STATE_EDITS, ids=lambda edit: edit.__name__)
def test_every_state_edit_is_reached(edit):
    """Each edit, alone on a matrix with a permutation, still gives a file that torch can write."""
    rng = example_rng(0)
    matrix = TCSparseTensor.from_coo(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), reorder=torch.tensor([2, 0, 1]))
    data = saved_files.save(saved_files.Crafted(edit(rng, saved_files.state_of(matrix))))
    outcome = attempt(lambda f: torch.load(f, weights_only=True), data)
    if not isinstance(outcome, ValueError):
        check_loaded(outcome, rng)
