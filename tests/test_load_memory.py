"""Loading a file of S bytes with ``torch_tcsparse.load`` peaks at no more than 2 S + 50 MB of
resident memory, whatever the file holds: archives whose records would inflate or share bytes
are refused from their zip directory, before torch reads a record. Each load runs in a fresh
interpreter, so that no memory an earlier test freed is reused unseen."""
import io
import json
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.serialization import MAX_PICKLE_BYTES, MAX_RECORDS

ROOT = Path(__file__).resolve().parents[1]
SLACK = 50 * 2**20

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                reason="needs a resettable peak resident size (/proc/self/clear_refs)")

PEAKS_OF_LOADS = textwrap.dedent("""
    import gc, json, sys
    import torch
    import torch_tcsparse

    def kib(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

    results = []
    for path, reader in json.loads(sys.argv[1]):
        read = torch_tcsparse.load if reader == "tcsparse" else lambda f: torch.load(f, weights_only=True)
        gc.collect()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        before = kib("VmRSS")
        try:
            outcome = type(read(path)).__name__
        except ValueError as error:
            outcome = f"ValueError: {error}"
        results.append({"peak": (kib("VmHWM") - before) * 1024, "outcome": outcome})
    print(json.dumps(results))
""")


def load_in_fresh_process(*loads: tuple[Path, str]) -> list[tuple[int, str]]:
    """For each (path, reader) in turn, in one fresh interpreter: the peak resident growth of
    loading the file with ``torch_tcsparse.load`` ("tcsparse") or ``torch.load`` ("torch"), and
    what the load gave (a type name, or the ValueError's message). Large tensors are mapped and
    unmapped whole, so an earlier load leaves no freed memory that a later one would reuse unseen."""
    argument = json.dumps([[str(path), reader] for path, reader in loads])
    result = subprocess.run([sys.executable, "-c", PEAKS_OF_LOADS, argument], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [(measured["peak"], measured["outcome"]) for measured in json.loads(result.stdout.strip().splitlines()[-1])]


def assert_bounded(path: Path, peak: int) -> None:
    size = path.stat().st_size
    assert peak <= 2 * size + SLACK, f"loading a {size:,}-byte file peaked {peak:,} bytes above the start"


def records_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def storage_names(records: dict[str, bytes]) -> list[str]:
    return [name for name in records if "/data/" in name and not name.endswith(".pkl")]


def stored_zip(records: dict[str, bytes], aliases: dict[str, str] | None = None) -> bytes:
    """A zip archive of ``records``, stored, whose directory also lists each alias as a record over
    the bytes of the record it names: records that share bytes."""
    body, directory, offsets = bytearray(), bytearray(), {}
    entries = [(name, name) for name in records] + list((aliases or {}).items())
    for name, record in records.items():
        offsets[name] = len(body)
        encoded = name.encode()
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(record), len(record), len(record),
                            len(encoded), 0) + encoded + record
    for name, target in entries:
        record, encoded = records[target], name.encode()
        directory += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, zlib.crc32(record), len(record),
                                 len(record), len(encoded), 0, 0, 0, 0, 0, offsets[target]) + encoded
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(directory), len(body), 0)
    return bytes(body + directory + end)


def compressed_bomb(path: Path) -> None:
    """A saved matrix whose storages are 128 MiB of zeros each, deflated to 128 KiB: torch would
    inflate a whole record before anything could check it."""
    records = records_of(saved(TCSparseTensor.from_dense(torch.eye(3))))
    with zipfile.ZipFile(path, "w") as archive:
        for name, record in records.items():
            if name in storage_names(records):
                archive.writestr(name, bytes(128 * 2**20), compress_type=zipfile.ZIP_DEFLATED)
            else:
                archive.writestr(name, record)


def shared_records(path: Path) -> None:
    """A list of 64 tensors whose directory lists one 1 MiB record under the 64 storages' names."""
    records = records_of(saved([torch.zeros(2**18) for _ in range(64)]))
    first, *others = storage_names(records)
    kept = {name: record for name, record in records.items() if name not in others}
    path.write_bytes(stored_zip(kept, {name: first for name in others}))


def many_records(path: Path) -> None:
    records = records_of(saved(TCSparseTensor.from_dense(torch.eye(3))))
    # zipfile writes zip64's end of directory past 65,535 records.
    with zipfile.ZipFile(path, "w") as archive:
        for name, record in records.items():
            archive.writestr(name, record)
        for number in range(MAX_RECORDS):
            archive.writestr(f"archive/extra/{number}", b"")


def large_pickle(path: Path) -> None:
    torch.save(list(range(MAX_PICKLE_BYTES // 4)), path)


def large_matrix(path: Path) -> None:
    """4M nonzeros with float32 values: a 33 MB file, whose Tensor-Core layout alone (about 12
    bytes per nonzero) would take more than the file; it is built at the first product instead."""
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 400_000, (2, 4_000_000), generator=generator)
    weights = torch.rand(4_000_000, generator=generator)
    torch.save(TCSparseTensor.from_edge_index(edge_index, weights, num_nodes=400_000), path)


# Refused files first: what they might leave behind cannot lower the peak of a later load.
FILES = {"compressed": compressed_bomb, "shared": shared_records, "many": many_records, "pickle": large_pickle,
         "matrix": large_matrix}
LOADS = [(name, "tcsparse") for name in FILES] + [("matrix", "torch")]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """{(file, reader): (path, peak, outcome)} for every load of ``LOADS``, measured in one process."""
    folder = tmp_path_factory.mktemp("files")
    paths = {name: folder / f"{name}.pt" for name in FILES}
    for name, write in FILES.items():
        write(paths[name])
    results = load_in_fresh_process(*((paths[name], reader) for name, reader in LOADS))
    return {load: (paths[load[0]], *result) for load, result in zip(LOADS, results)}


@pytest.mark.parametrize(("name", "message"), [
    ("compressed", "is compressed (method 8: "),
    ("shared", "records claim"),
    ("many", f"records, more than the {MAX_RECORDS:,}"),
    ("pickle", f"more than the {MAX_PICKLE_BYTES:,}"),
])
def test_an_archive_torch_could_not_read_in_bounded_memory_is_refused(loaded, name, message):
    path, peak, outcome = loaded[name, "tcsparse"]
    assert outcome.startswith("ValueError: refused torch file") and message in outcome, outcome
    assert_bounded(path, peak)


@pytest.mark.parametrize("reader", ["tcsparse", "torch"])
def test_a_saved_matrix_loads_within_twice_its_size(loaded, reader):
    path, peak, outcome = loaded["matrix", reader]
    assert outcome == "TCSparseTensor", outcome
    assert_bounded(path, peak)
