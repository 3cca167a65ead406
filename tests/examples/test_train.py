"""The GCN example end to end: OGB-format datasets through ogb's real loader, Planetoid and
ogbl-ddi through theirs (skipped when ../shared/data is absent), both backends."""
import gzip
import math
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# The example reads every dataset through ogb (a test dependency; the GPU machine lacks it).
pytest.importorskip("ogb", reason="ogb is not installed")
from torch_tcsparse.datasets import ogb_format  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "gcn"))
import train  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"
PLANETOID_ROOT = SHARED_DATA / "planetoid"
OGB_ROOT = SHARED_DATA / "ogb"
needs_planetoid = pytest.mark.skipif(
    not (PLANETOID_ROOT / "Cora" / "raw").is_dir(), reason=f"Planetoid raw files not found under {PLANETOID_ROOT}"
)
needs_ddi = pytest.mark.skipif(
    not (OGB_ROOT / "ogbl_ddi" / "raw").is_dir(), reason=f"ogbl-ddi not found under {OGB_ROOT}"
)
TINY = dict(num_nodes=400, num_classes=4, num_features=16, avg_degree=8.0, homophily=0.6, feature_signal=0.3)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Generated datasets and mirrors go to the test's own folder, never the user's cache."""
    monkeypatch.setenv("TCSPARSE_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def tiny_folder(tmp_path):
    folder = tmp_path / "tiny"
    ogb_format.write_node_dataset(ogb_format.planted_partition(**TINY, seed=3), folder, name="ogbn-tiny")
    return folder


def test_written_dataset_reads_back_through_ogb(tiny_folder):
    graph = ogb_format.planted_partition(**TINY, seed=3)
    dataset, evaluator = ogb_format.load_node_dataset(tiny_folder)
    data = dataset[0]
    assert type(dataset).__name__ == "PygNodePropPredDataset"
    assert data.num_nodes == 400 and dataset.num_classes == 4
    # ogb adds the reverse of every stored edge (add_inverse_edge), interleaved.
    forward = data.edge_index[:, 0::2].numpy()
    np.testing.assert_array_equal(forward, graph.edge_index)
    np.testing.assert_array_equal(data.edge_index[:, 1::2].numpy(), graph.edge_index[::-1])
    np.testing.assert_allclose(data.x.numpy(), graph.node_feat, rtol=1e-6)
    np.testing.assert_array_equal(data.y.numpy(), graph.node_label)
    split = dataset.get_idx_split()
    for part in ogb_format.SPLITS:
        np.testing.assert_array_equal(split[part].numpy(), graph.split[part])
    assert evaluator.eval({"y_true": data.y[:10], "y_pred": data.y[:10]}) == {"acc": 1.0}


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
    dataset, _ = ogb_format.default_dataset(tmp_path, **TINY)
    folders = [p for p in (tmp_path / "ogb").iterdir()]
    assert len(folders) == 1 and not folders[0].name.startswith(".staging")
    stamp = (folders[0] / "raw" / "edge.csv.gz").stat().st_mtime_ns
    again, _ = ogb_format.default_dataset(tmp_path, **TINY)
    assert (folders[0] / "raw" / "edge.csv.gz").stat().st_mtime_ns == stamp
    assert torch.equal(dataset[0].edge_index, again[0].edge_index)


def test_trusted_torch_load_is_scoped(tmp_path):
    original = torch.load
    path = tmp_path / "object.pt"
    torch.save({"array": np.arange(3)}, path)
    with pytest.raises(Exception, match="[Ww]eights"):
        torch.load(path)
    with ogb_format.trusted_torch_load():
        assert torch.load(path)["array"].tolist() == [0, 1, 2]
    assert torch.load is original
    with pytest.raises(RuntimeError, match="inside"):
        with ogb_format.trusted_torch_load():
            raise RuntimeError("inside")
    assert torch.load is original


def test_writable_root_mirrors_read_only_folders(tmp_path):
    source = tmp_path / "shared" / "Graph"
    (source / "raw").mkdir(parents=True)
    (source / "raw" / "file.txt").write_text("x")
    source.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        root = ogb_format.writable_root(tmp_path / "shared", "Graph", cache=tmp_path / "cache")
        assert root != (tmp_path / "shared").resolve()
        assert (root / "Graph" / "raw" / "file.txt").read_text() == "x"
        assert (root / "Graph" / "raw").is_symlink()
        assert not (source / "processed").exists()
    finally:
        source.chmod(stat.S_IRWXU)
    assert ogb_format.writable_root(tmp_path / "shared", "Graph") == (tmp_path / "shared").resolve()
    with pytest.raises(ValueError, match="no dataset folder"):
        ogb_format.writable_root(tmp_path, "Missing")


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
    with pytest.raises(ValueError, match="no meta_dict.json"):
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
    assert any((tmp_path / "cache" / "ogb").iterdir())


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


@needs_planetoid
@pytest.mark.parametrize("name, floor", [("Cora", 0.75), ("CiteSeer", 0.65)])
def test_planetoid(name, floor):
    summary = train.run(["--dataset", name, "--root", str(PLANETOID_ROOT), "--epochs", "100",
                         "--device", "cpu", "--quiet"])
    assert summary["test_mean"] > floor, summary["test_mean"]
    assert not (PLANETOID_ROOT / name / "processed").exists(), "the shared data must stay untouched"


@needs_ddi
def test_ogbl_ddi_link_prediction():
    # One full-graph step per epoch with 8 channels: the real loader, split, negative sampling
    # and Hits@20 evaluation, cheaply. Learning itself is covered by the node tests above.
    summary = train.run(["--dataset", "ogbl-ddi", "--root", str(OGB_ROOT), "--epochs", "1", "--hidden", "8",
                         "--batch-size", "2000000", "--device", "cpu", "--quiet"])
    run = summary["runs"][0]
    assert summary["metric"] == "hits@20"
    assert 0.0 <= run["test"] <= 1.0 and 0.0 <= run["valid"] <= 1.0
    assert math.isfinite(run["losses"][0]) and run["losses"][0] > 0
    assert not (OGB_ROOT / "ogbl_ddi" / "processed").exists(), "the shared data must stay untouched"


def test_negative_sampler_is_uniform_over_non_edges():
    from train import NegativeSampler

    torch.manual_seed(0)
    edges = torch.tensor([[0, 1, 2, 3, 3], [1, 0, 3, 2, 3]])  # (3, 3) a self-loop
    sampler = NegativeSampler(edges, num_nodes=7)
    drawn = sampler(20000)
    counts = {}
    for pair in map(tuple, drawn.t().tolist()):
        counts[pair] = counts.get(pair, 0) + 1
    allowed = {(r, c) for r in range(7) for c in range(7) if r != c} - {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert set(counts) == allowed
    expected = 20000 / len(allowed)
    assert all(abs(count - expected) < 5 * math.sqrt(expected) for count in counts.values())
