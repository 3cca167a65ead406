"""examples.gcn.blocks: an export read back block by block equals ``block_of`` of the loaded
task, training from it under gloo gives the dataset's loss curve without loading the dataset,
a crafted folder is refused with a ValueError naming its problem, and the export never
overwrites a folder that is not one of its own."""
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("ogb", reason="ogb is not installed")
# The distributed tests' gloo launcher; the spawned ranks find it (and this module) on the same path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import processes  # noqa: E402

from examples.gcn import blocks, train, train_distributed  # noqa: E402
from graph_data import ogb_format  # noqa: E402
from torch_tcsparse.distributed import block_bounds  # noqa: E402

SMALL_RUN = ["--epochs", "3", "--hidden", "16", "--eval-steps", "1", "--quiet"]


@pytest.fixture(scope="module")
def synthetic_task():
    return train.load_task(train.parse_args([]))


@pytest.fixture(scope="module")
def synthetic_export(synthetic_task, tmp_path_factory):
    return blocks.main(["--out", str(tmp_path_factory.mktemp("export") / "synthetic")])


@pytest.fixture(scope="module")
def binary_folder(tmp_path_factory):
    """A small dataset of three 0/1 tasks scored by ROC-AUC, in OGB's format."""
    graph = ogb_format.planted_partition(num_nodes=300, num_classes=3, num_features=8, seed=2)
    graph = dataclasses.replace(graph, node_label=(graph.node_label == np.arange(3)).astype(np.int64), num_classes=2)
    folder = tmp_path_factory.mktemp("binary") / "dataset"
    ogb_format.write_node_dataset(graph, folder, name="ogbn-tiny-binary", task_type="binary classification",
                                  eval_metric="rocauc")
    return folder


@pytest.fixture(scope="module")
def binary_export(binary_folder, tmp_path_factory):
    return blocks.main(["--dataset", str(binary_folder), "--out", str(tmp_path_factory.mktemp("export") / "binary")])


def assert_same_block(got, want) -> None:
    assert vars(got).keys() == vars(want).keys()
    for name, expected in vars(want).items():
        value = getattr(got, name)
        if isinstance(expected, torch.Tensor):
            assert value.dtype == expected.dtype and torch.equal(value, expected), name
        elif isinstance(expected, dict):
            assert list(value) == list(expected), name
            for split in expected:
                assert torch.equal(value[split], expected[split]), (name, split)
        else:
            assert type(value) is type(expected) and value == expected, name


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_read_block_equals_block_of(synthetic_task, synthetic_export, world_size, monkeypatch):
    opened = []
    load = np.load
    monkeypatch.setattr(np, "load", lambda *args, **kwargs: opened.append(kwargs) or load(*args, **kwargs))
    bounds = block_bounds(synthetic_task.x.size(0), world_size)
    for rank in range(world_size):
        assert_same_block(blocks.read_block(synthetic_export, bounds, rank),
                          train_distributed.block_of(synthetic_task, bounds, rank))
    assert opened and all(kwargs == {"mmap_mode": "r", "allow_pickle": False} for kwargs in opened)


def test_binary_task_reads_back(binary_folder, binary_export):
    task = train.load_task(train.parse_args(["--dataset", str(binary_folder)]))
    bounds = block_bounds(task.x.size(0), 2)
    for rank in range(2):
        assert_same_block(blocks.read_block(binary_export, bounds, rank),
                          train_distributed.block_of(task, bounds, rank))
    meta = json.loads((binary_export / "meta.json").read_text())
    assert meta["metric"] == "rocauc" and meta["num_outputs"] == 3 and meta["dataset"] == str(binary_folder)


def refuse_whole_task(args):
    raise AssertionError(f"training from blocks loaded the whole task ({args.dataset})")


def train_both_ways(runs, summaries_path, device_type: str = "cpu") -> None:
    """Every run on this rank from its dataset, then from its export with the loader refused."""
    device = torch.device(device_type, dist.get_rank()) if device_type == "cuda" else torch.device(device_type)
    summaries = {}
    for route in ("dataset", "blocks"):
        if route == "blocks":
            train.load_task = refuse_whole_task
        for name, dataset, export in runs:
            flags = ["--dataset", dataset] if route == "dataset" else ["--blocks", export]
            args = train_distributed.parse_args(flags + SMALL_RUN + ["--device", device_type])
            config, dataset_name = train_distributed.training_config(args)
            summaries[name, route] = train_distributed.train(args, config, dataset_name, device)
    if dist.get_rank() == 0:
        torch.save(summaries, summaries_path)


def test_training_from_blocks_matches_the_dataset(synthetic_export, binary_folder, binary_export, tmp_path):
    runs = [("synthetic", "synthetic", str(synthetic_export)),
            ("binary", str(binary_folder), str(binary_export))]
    processes.run(2, train_both_ways, runs, tmp_path / "summaries.pt")
    summaries = torch.load(tmp_path / "summaries.pt")
    for name, *_ in runs:
        from_dataset, from_blocks = summaries[name, "dataset"], summaries[name, "blocks"]
        assert len(from_blocks["losses"]) == 3
        for summary in (from_dataset, from_blocks):
            del summary["epoch_times"]
        assert from_blocks == from_dataset, name
    # ROC-AUC is scored by ogb's evaluator, rebuilt from the export alone.
    assert 0.0 <= summaries["binary", "blocks"]["best"]["valid"] <= 1.0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_training_from_blocks_on_gpus(synthetic_export, tmp_path):
    """Under NCCL the partitioner's and the moves' collectives carry GPU tensors: both routes
    place the rows alike and train to the same losses (up to the GPU's order of sums)."""
    runs = [("synthetic", "synthetic", str(synthetic_export))]
    processes.run(2, train_both_ways, runs, tmp_path / "summaries.pt", "cuda", backend="nccl")
    summaries = torch.load(tmp_path / "summaries.pt")
    from_dataset, from_blocks = summaries["synthetic", "dataset"], summaries["synthetic", "blocks"]
    for key in ("processes", "halo_rows", "cut_nonzeros"):
        assert from_blocks[key] == from_dataset[key], key
    torch.testing.assert_close(torch.tensor(from_blocks["losses"]), torch.tensor(from_dataset["losses"]),
                               rtol=1e-5, atol=0)
    assert all(0.0 < loss < 10.0 for loss in from_blocks["losses"])


def rewrite(folder: Path, name: str, change) -> None:
    array = np.load(folder / name)
    np.save(folder / name, change(array.copy()))


def set_entry(index, value):
    def change(array):
        array[index] = value
        return array
    return change


def edit_meta(**fields):
    def crafted(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps(meta | fields))
    return crafted


def truncate(folder: Path) -> None:
    data = (folder / "x.npy").read_bytes()
    (folder / "x.npy").write_bytes(data[:-4])


def pickled_mask(folder: Path) -> None:
    np.save(folder / "mask_train.npy", np.array([None] * 4000, dtype=object), allow_pickle=True)


CRAFTED = {
    "wrong dtype": (lambda folder: rewrite(folder, "x.npy", lambda x: x.astype(np.float64)),
                    r"x\.npy: dtype must be float32, got float64"),
    "shape against meta": (edit_meta(num_features=65),
                           r"x\.npy: shape must be \(4000, 65\) \(meta.json\), got \(4000, 64\)"),
    "decreasing rowptr": (lambda folder: rewrite(folder, "rowptr.npy", set_entry(100, 10**6)),
                          r"rowptr\.npy: rowptr must be non-decreasing, got 1000000 at row 100"),
    "rowptr past col": (lambda folder: rewrite(folder, "rowptr.npy", set_entry(-1, 10**6)),
                        r"rowptr\.npy: rowptr must lie in \[0, 31912\] \(col.npy's length\), got 0\.\.1000000"),
    "column out of range": (lambda folder: rewrite(folder, "col.npy", set_entry(5, 4000)),
                            r"col\.npy: columns must be node ids in \[0, 4000\), got 4000"),
    "label out of range": (lambda folder: rewrite(folder, "y.npy", set_entry((7, 0), 8)),
                           r"y\.npy: labels must be class ids in \[0, 8\), got 8"),
    "pickled objects": (pickled_mask, r"mask_train\.npy: dtype must be bool, got object"),
    "truncated file": (truncate, r"x\.npy: holds \d+ bytes, its header promises \d+"),
    "meta type": (edit_meta(num_nodes="4000"), r"meta\.json: num_nodes must be an int, got '4000'"),
    "split name": (edit_meta(splits=["train", "valid", "test", "../x"]),
                   r"meta\.json: a split's name must be letters, digits and underscores, got '\.\./x'"),
    "not an export": (edit_meta(format="npy"), r"meta\.json: format must be 'torch_tcsparse.node_blocks', got 'npy'"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_folder_is_refused(synthetic_export, tmp_path, case):
    craft, message = CRAFTED[case]
    folder = shutil.copytree(synthetic_export, tmp_path / "crafted")
    craft(folder)
    with pytest.raises(ValueError, match=message):
        blocks.read_block(folder, (0, 4000), 0)


def test_a_rank_checks_only_its_block(synthetic_export, tmp_path):
    folder = shutil.copytree(synthetic_export, tmp_path / "crafted")
    bounds = block_bounds(4000, 2)
    last_column = int(np.load(folder / "rowptr.npy")[-1]) - 1
    rewrite(folder, "col.npy", set_entry(last_column, -3))
    blocks.read_block(folder, bounds, 0)
    with pytest.raises(ValueError, match=r"col\.npy: columns must be node ids in \[0, 4000\), got -3"):
        blocks.read_block(folder, bounds, 1)


def test_bounds_and_rank_are_checked(synthetic_export):
    with pytest.raises(ValueError, match=r"bounds must run from 0 to the export's 4000 nodes, got \(0, 10\)"):
        blocks.read_block(synthetic_export, (0, 10), 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        blocks.read_block(synthetic_export, (0, 2000, 4000), 2)
    with pytest.raises(TypeError, match="bounds must hold ints, got 2000.0"):
        blocks.read_block(synthetic_export, (0, 2000.0, 4000), 0)


def test_export_refuses_a_folder_of_other_files(synthetic_task, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept")
    with pytest.raises(ValueError, match="is not empty and not a block export"):
        blocks.export(synthetic_task, folder, "synthetic")
    with pytest.raises(SystemExit, match="error: .* is not empty and not a block export"):
        blocks.main(["--out", str(folder)])
    assert [entry.name for entry in folder.iterdir()] == ["notes.txt"]
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["out"], "no temporary sibling is left behind"


def test_export_replaces_only_its_own_files(synthetic_task, synthetic_export, tmp_path):
    folder = shutil.copytree(synthetic_export, tmp_path / "out")
    blocks.export(synthetic_task, folder, "synthetic")
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["out"], "no temporary sibling is left behind"
    blocks.read_block(folder, (0, 4000), 0)
    (folder / "notes.txt").write_text("kept")
    with pytest.raises(ValueError, match=r"holding other files too \(notes.txt\)"):
        blocks.export(synthetic_task, folder, "synthetic")
    assert (folder / "notes.txt").read_text() == "kept"


def test_blocks_and_dataset_are_exclusive():
    with pytest.raises(SystemExit, match="give --blocks or --dataset/--root, not both"):
        train_distributed.parse_args(["--blocks", "folder", "--dataset", "Cora"])
    assert train_distributed.parse_args([]).dataset == "synthetic"
