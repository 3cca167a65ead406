"""The GCN example end to end: OGB-format datasets through ogb's real loader, Planetoid and
ogbl-ddi through theirs (skipped when their files are not in the data root), both backends."""
import fractions
import gzip
import math
import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

# The example reads every dataset through ogb (a test dependency; the GPU machine lacks it).
pytest.importorskip("ogb", reason="ogb is not installed")
from examples.gcn import data, train  # noqa: E402
from graph_data import ogb_format  # noqa: E402
from graph_data.folders import data_root, loader_mirror  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PLANETOID_ROOT = data_root() / "planetoid"
OGB_ROOT = data_root() / "ogb"


def needs(name: str, root: Path):
    missing = data.missing_files(name, root)
    return pytest.mark.skipif(bool(missing), reason=f"{name}: no {missing[0] if missing else ''} (set TCSPARSE_DATA)")


TINY = dict(num_nodes=400, num_classes=4, num_features=16, avg_degree=8.0, homophily=0.6, feature_signal=0.3)


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def tiny_folder(tmp_path):
    folder = tmp_path / "tiny"
    ogb_format.write_node_dataset(ogb_format.planted_partition(**TINY, seed=3), folder, name="ogbn-tiny")
    return folder


def test_written_dataset_reads_back_through_ogb(tiny_folder):
    graph = ogb_format.planted_partition(**TINY, seed=3)
    before = sorted(tiny_folder.rglob("*"))
    dataset, evaluator = ogb_format.load_node_dataset(tiny_folder)
    assert sorted(tiny_folder.rglob("*")) == before, "a folder given for reading is never written to"
    graph_data = dataset[0]
    assert type(dataset).__name__ == "PygNodePropPredDataset"
    assert graph_data.num_nodes == 400 and dataset.num_classes == 4
    # ogb adds the reverse of every stored edge (add_inverse_edge), interleaved.
    forward = graph_data.edge_index[:, 0::2].numpy()
    np.testing.assert_array_equal(forward, graph.edge_index)
    np.testing.assert_array_equal(graph_data.edge_index[:, 1::2].numpy(), graph.edge_index[::-1])
    np.testing.assert_allclose(graph_data.x.numpy(), graph.node_feat, rtol=1e-6)
    np.testing.assert_array_equal(graph_data.y.numpy(), graph.node_label)
    split = dataset.get_idx_split()
    for part in ogb_format.SPLITS:
        np.testing.assert_array_equal(split[part].numpy(), graph.split[part])
    assert evaluator.eval({"y_true": graph_data.y[:10], "y_pred": graph_data.y[:10]}) == {"acc": 1.0}


def test_planted_partition_is_deterministic_and_valid():
    first, second = (ogb_format.planted_partition(**TINY, seed=7) for _ in range(2))
    np.testing.assert_array_equal(first.edge_index, second.edge_index)
    low, high = first.edge_index
    assert (low < high).all(), "edges are stored once, as (low, high), without self-loops"
    assert np.unique(low * 400 + high).size == low.size
    all_nodes = np.concatenate([first.split[p] for p in ogb_format.SPLITS])
    np.testing.assert_array_equal(np.sort(all_nodes), np.arange(400))


def test_written_files_are_reproducible(tmp_path):
    graph = ogb_format.planted_partition(**TINY)
    a = ogb_format.write_node_dataset(graph, tmp_path / "a")
    ogb_format.write_node_dataset(graph, tmp_path / "b")
    assert a["dir_path"] == str((tmp_path / "a").resolve())
    for name in ("edge", "node-feat", "node-label"):
        assert (tmp_path / "a" / "raw" / f"{name}.csv.gz").read_bytes() == (tmp_path / "b" / "raw" / f"{name}.csv.gz").read_bytes()
    with gzip.open(tmp_path / "a" / "raw" / "num-node-list.csv.gz", "rt") as handle:
        assert handle.read().strip() == "400"


def test_default_dataset_is_generated_once(tmp_path):
    dataset, _ = ogb_format.default_dataset(**TINY)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["generated"]
    folders = list((tmp_path / "cache" / "generated").iterdir())
    assert len(folders) == 1 and not folders[0].name.startswith(".staging")
    stamp = (folders[0] / "raw" / "edge.csv.gz").stat().st_mtime_ns
    again, _ = ogb_format.default_dataset(**TINY)
    assert (folders[0] / "raw" / "edge.csv.gz").stat().st_mtime_ns == stamp
    assert torch.equal(dataset[0].edge_index, again[0].edge_index)


def test_ogb_file_globals_allow_only_ogb_types(tmp_path):
    arrays, other = tmp_path / "arrays.pt", tmp_path / "other.pt"
    torch.save({"edge": np.arange(6).reshape(3, 2)}, arrays)
    torch.save({"ratio": fractions.Fraction(1, 3)}, other)
    with pytest.raises(Exception, match="[Ww]eights only"):
        torch.load(arrays)
    with ogb_format.ogb_file_globals():
        assert torch.load(arrays)["edge"].tolist() == [[0, 1], [2, 3], [4, 5]]
        with pytest.raises(Exception, match="[Ww]eights only"):
            torch.load(other)
    with pytest.raises(Exception, match="[Ww]eights only"):
        torch.load(arrays)


def test_loader_mirror_links_everything_but_processed(tmp_path):
    source = tmp_path / "given" / "Graph"
    (source / "raw").mkdir(parents=True)
    (source / "raw" / "file.txt").write_text("x")
    (source / "processed").mkdir()
    mirror = loader_mirror(source)
    assert mirror.name == "Graph" and (tmp_path / "cache") in mirror.parents
    assert (mirror / "raw").is_symlink() and (mirror / "raw" / "file.txt").read_text() == "x"
    assert not (mirror / "processed").exists()
    assert loader_mirror(source) == mirror
    assert loader_mirror(tmp_path / "given" / ".." / "given" / "Graph") == mirror
    with pytest.raises(ValueError, match="source must be a dataset folder"):
        loader_mirror(tmp_path / "missing")


def test_write_validation(tmp_path):
    graph = ogb_format.planted_partition(**TINY)
    with pytest.raises(ValueError, match="eval_metric must be 'acc' or 'rocauc'.*'mrr'"):
        ogb_format.write_node_dataset(graph, tmp_path, eval_metric="mrr")
    graph.split = {"train": graph.split["train"]}
    with pytest.raises(ValueError, match="split must hold exactly"):
        ogb_format.write_node_dataset(graph, tmp_path)
    with pytest.raises(ValueError, match="homophily must lie in"):
        ogb_format.planted_partition(homophily=1.5)
    graph.split = ogb_format.planted_partition(**TINY).split
    graph.node_label = graph.node_label[:10]
    with pytest.raises(ValueError, match=r"node_label has 10 rows, expected one per node \(400\)"):
        ogb_format.write_node_dataset(graph, tmp_path)
    with pytest.raises(ValueError, match="holds no meta_dict.json"):
        ogb_format.load_node_dataset(tmp_path / "nowhere")


@pytest.mark.parametrize("backend", ["tcsparse", "pyg"])
def test_trains_on_written_dataset(tiny_folder, backend):
    summary = train.run(["--dataset", str(tiny_folder), "--backend", backend, "--epochs", "30",
                         "--hidden", "32", "--device", "cpu", "--quiet"])
    chance = 1 / 4
    assert summary["metric"] == "acc"
    assert summary["test_mean"] > chance + 0.3, summary["test_mean"]
    run = summary["runs"][0]
    assert run["losses"][-1] < run["losses"][0]
    assert len(run["epoch_times"]) == 30 and summary["preprocess_s"] > 0


def test_both_backends_learn_the_same_model(tiny_folder):
    """Same seed, same initial weights (ours and PyG's GCNConv draw them alike): same training."""
    args = ["--dataset", str(tiny_folder), "--epochs", "10", "--hidden", "16", "--device", "cpu", "--quiet"]
    ours = train.run(args + ["--backend", "tcsparse"])["runs"][0]
    theirs = train.run(args + ["--backend", "pyg"])["runs"][0]
    np.testing.assert_allclose(ours["losses"], theirs["losses"], rtol=1e-4)


def test_default_command_runs_offline(tmp_path):
    """The README's main command, shortened: the embedded default through ogb's loader."""
    summary = train.run(["--epochs", "10", "--hidden", "64", "--device", "cpu", "--quiet"])
    assert summary["dataset"] == "synthetic"
    assert summary["test_mean"] > 1 / 8 + 0.2, summary["test_mean"]
    assert any((tmp_path / "cache" / "generated").iterdir())


def test_multi_task_binary_dataset_uses_rocauc(tmp_path):
    """An ogbn-proteins-shaped task: edge features only, 3 binary tasks, ROC-AUC."""
    graph = ogb_format.planted_partition(**TINY)
    rng = np.random.default_rng(0)
    label = graph.node_label[:, 0]
    graph.node_label = np.stack([label == 0, label == 1, label >= 2], axis=1).astype(np.int64)
    endpoint_labels = label[graph.edge_index]
    graph.edge_feat = (np.eye(4)[endpoint_labels[0]] + rng.normal(0, 0.5, (graph.edge_index.shape[1], 4))).astype(np.float32)
    graph.node_feat = None
    meta = ogb_format.write_node_dataset(graph, tmp_path / "proteins_like", name="ogbn-proteins-like",
                                         task_type="binary classification", eval_metric="rocauc")
    assert meta["has_node_attr"] == "False" and meta["has_edge_attr"] == "True"
    summary = train.run(["--dataset", str(tmp_path / "proteins_like"), "--epochs", "20", "--hidden", "32",
                         "--device", "cpu", "--quiet"])
    assert summary["metric"] == "rocauc"
    assert summary["test_mean"] > 0.7, summary["test_mean"]


@pytest.mark.parametrize("name, floor", [
    pytest.param("Cora", 0.75, marks=needs("Cora", PLANETOID_ROOT)),
    pytest.param("CiteSeer", 0.65, marks=needs("CiteSeer", PLANETOID_ROOT)),
])
def test_planetoid(name, floor):
    before = sorted((PLANETOID_ROOT / name).rglob("*"))
    summary = train.run(["--dataset", name, "--root", str(PLANETOID_ROOT), "--epochs", "100",
                         "--device", "cpu", "--quiet"])
    assert summary["test_mean"] > floor, summary["test_mean"]
    assert sorted((PLANETOID_ROOT / name).rglob("*")) == before, "the data root is only read"


@needs("ogbl-ddi", OGB_ROOT)
def test_ogbl_ddi_link_prediction():
    # One full-graph step per epoch with 8 channels: the real loader, split, negative sampling
    # and Hits@20 evaluation, cheaply. Learning itself is covered by the node tests above.
    summary = train.run(["--dataset", "ogbl-ddi", "--root", str(OGB_ROOT), "--epochs", "1", "--hidden", "8",
                         "--batch-size", "2000000", "--device", "cpu", "--quiet"])
    run = summary["runs"][0]
    assert summary["metric"] == "hits@20"
    assert 0.0 <= run["test"] <= 1.0 and 0.0 <= run["valid"] <= 1.0
    assert math.isfinite(run["losses"][0]) and run["losses"][0] > 0
    assert not (OGB_ROOT / "ogbl_ddi" / "processed").exists(), "the data root is only read"


@pytest.mark.parametrize("dataset", ["ogbl-ddi", "Cora", "ogbn-arxiv"])
def test_missing_data_is_one_line_and_creates_nothing(tmp_path, dataset):
    """A dataset command pointed at a folder without the data (a folder, but not the files)."""
    given = tmp_path / "given"
    (given / data.folder_name(dataset) / "raw").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--dataset", dataset, "--root", str(given), "--device", "cpu"])
    message = str(exit_info.value)
    assert message.startswith(f"error: {dataset} not found under --root {given}") and "\n" not in message
    assert sorted(tmp_path.rglob("*")) == before


def test_missing_data_command_prints_no_traceback(tmp_path):
    """The README's ogbl-ddi command without the data, as a new user runs it."""
    done = subprocess.run([sys.executable, "-m", "examples.gcn.train", "--dataset", "ogbl-ddi", "--root",
                           str(tmp_path / "nowhere"), "--device", "cpu"], cwd=REPO, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=os.environ | {"TCSPARSE_CACHE": str(tmp_path / "cache")},
                          timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    # Only the one line of ours: interpreter warnings of installed packages may precede it.
    ours = [line for line in done.stderr.splitlines() if not line.startswith((" ", "\t")) and "Warning" not in line]
    assert len(ours) == 1 and ours[0].startswith("error: ogbl-ddi not found"), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    import torch_geometric.datasets

    def offline(root, name, **options):
        (Path(root) / name / "raw").mkdir(parents=True)  # as PyG does before downloading
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torch_geometric.datasets, "Planetoid", offline)
    with pytest.raises(data.MissingData, match="could not download Cora .*URLError.*offline, pass --root ROOT"):
        data.load_planetoid("Cora")
    assert not (data.download_root("Cora") / "Cora").exists()


def test_interrupted_download_is_cleared_before_ogb_sees_it(monkeypatch):
    """ogb asks on the terminal whether to "update" a dataset folder lacking its release file."""
    partial = data.download_root("ogbl-ddi") / "ogbl_ddi" / "raw"
    partial.mkdir(parents=True)
    root, downloads = data.loader_root("ogbl-ddi", None)
    assert downloads and root == data.download_root("ogbl-ddi") and not partial.parent.exists()


def test_long_run_is_announced(tiny_folder, monkeypatch, capsys):
    monkeypatch.setattr(train, "LONG_RUN_S", 0.0)
    train.run(["--dataset", str(tiny_folder), "--epochs", "2", "--hidden", "8", "--device", "cpu", "--quiet"])
    assert "warning: the first epoch took" in capsys.readouterr().err
    assert "2 epochs take about 1.0 h per run" in train.long_run_warning(1800.0, 2, "cpu")


def test_root_is_refused_for_the_generated_default(tmp_path):
    with pytest.raises(SystemExit, match="--root names where a downloaded dataset lies"):
        train.run(["--root", str(tmp_path), "--device", "cpu", "--quiet"])


def test_negative_sampler_is_uniform_over_non_edges():
    torch.manual_seed(0)
    edges = torch.tensor([[0, 1, 2, 3, 3], [1, 0, 3, 2, 3]])  # (3, 3) a self-loop
    sampler = train.NegativeSampler(edges, num_nodes=7)
    drawn = sampler(20000)
    counts = {}
    for pair in map(tuple, drawn.t().tolist()):
        counts[pair] = counts.get(pair, 0) + 1
    allowed = {(r, c) for r in range(7) for c in range(7) if r != c} - {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert set(counts) == allowed
    expected = 20000 / len(allowed)
    assert all(abs(count - expected) < 5 * math.sqrt(expected) for count in counts.values())
