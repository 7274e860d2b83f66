"""Saec's clustering: lossless on duplicates, every feature indexed, the byte plan, head-first against full KMeans."""

import numpy as np
import pytest
import torch

from components.embeddings.compress import (
    Settings,
    centroid_parameters,
    cluster_field,
    compress_model,
    compressed_bytes,
    full_kmeans,
    hybrid,
    nearest,
    plan_clusters,
)
from components.embeddings.model import DLRM, ClusteredEmbedding, FullEmbedding, evaluate, fit, predict


def grouped_table(size=2000, groups=40, dim=16, noise=0.05, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(groups, dim, generator=generator)
    membership = torch.randint(0, groups, (size,), generator=generator)
    vectors = centres[membership] + noise * torch.randn(size, dim, generator=generator)
    ranks = torch.randperm(size, generator=generator).double()
    counts = torch.floor(5000.0 / (ranks + 1) ** 1.1).long()
    return vectors, counts, membership


def test_a_field_of_exact_duplicates_is_compressed_without_loss():
    distinct = torch.randn(7, 16)
    rows = torch.randint(0, 7, (500,), generator=torch.Generator().manual_seed(1))
    vectors = distinct[rows]
    counts = torch.randint(1, 50, (500,), generator=torch.Generator().manual_seed(2))
    clustering, facts = cluster_field(vectors, counts, clusters=10)
    assert facts["lossless"] and facts["distinct"] == 7 and facts["distortion"] == 0.0
    assert clustering.clusters == 7
    assert torch.equal(clustering.vectors(), vectors)  # bit for bit, every feature


def test_duplicates_with_fewer_clusters_than_distinct_vectors_are_not_called_lossless():
    vectors = torch.randn(6, 4).repeat(10, 1)
    clustering, facts = cluster_field(vectors, torch.ones(60, dtype=torch.long), clusters=3)
    assert not facts["lossless"] and clustering.clusters <= 3


def test_the_index_maps_every_feature_and_unseen_features_read_the_fallback():
    vectors, counts, _ = grouped_table()
    counts[:100] = 0  # never seen in training
    fallback = torch.full((16,), 0.5)
    clustering, facts = cluster_field(vectors, counts, clusters=50, fallback=fallback)
    index = clustering.index.long()
    assert len(index) == len(vectors) and clustering.index.dtype == torch.uint8  # 51 rows fit a byte
    assert int(index.min()) >= 0 and int(index.max()) <= clustering.clusters
    unseen = counts == 0
    assert bool((index[unseen] == clustering.clusters).all())  # the fallback row, no unknown ids
    assert bool((index[~unseen] < clustering.clusters).all())  # every seen feature has a real centroid
    assert torch.equal(clustering.centroids[clustering.clusters], fallback)
    assert facts["seen"] == len(vectors) - 100
    # Every centroid some feature uses: none is dead weight.
    assert set(index[~unseen].tolist()) == set(range(clustering.clusters))


def test_the_clustering_recovers_latent_groups_and_the_tail_goes_to_the_nearest_centroid():
    vectors, counts, membership = grouped_table(groups=40)
    clustering, facts = cluster_field(vectors, counts, clusters=40, head=0.1, seed=0)
    assert facts["head"] >= 3 * 40 and facts["head"] < len(vectors)
    assert facts["distortion"] < 0.1  # groups are tight: sharing a vector loses little
    index = clustering.index.long().numpy()
    # The features of one latent group mostly share one cluster.
    purity = np.mean([np.bincount(index[membership.numpy() == group]).max() / (membership == group).sum().item()
                      for group in range(40)])
    assert purity > 0.9
    centroids = clustering.centroids[:-1].numpy()
    tail = np.argsort(-counts.numpy(), kind="stable")[facts["head"]:]
    assert np.array_equal(index[tail], nearest(vectors.numpy()[tail], centroids))


def test_head_first_is_about_as_good_as_full_kmeans():
    vectors, counts, _ = grouped_table(size=3000, groups=60, noise=0.1)
    _, ours = cluster_field(vectors, counts, clusters=60, head=0.1, seed=0)
    _, full = full_kmeans(vectors, counts, clusters=60, seed=0)
    assert full["head"] == 3000 > ours["head"] and full["seen"] == ours["seen"] == int((counts > 0).sum())
    assert ours["distortion"] < full["distortion"] * 1.5 + 0.01


def test_plain_kmeans_plusplus_seeding_of_the_head_recovers_the_groups_too():
    """``local_trials=1`` seeds the head with one k-means++ draw per centre (Arthur and Vassilvitskii's original)
    instead of scikit-learn's best of 2 + ln k: on tight latent groups it finds them as well."""
    vectors, counts, membership = grouped_table(groups=40)
    _, greedy = cluster_field(vectors, counts, clusters=40, head=0.1, seed=0)
    clustering, plain = cluster_field(vectors, counts, clusters=40, head=0.1, seed=0, local_trials=1)
    assert plain["head"] == greedy["head"] and plain["distortion"] < 0.1
    index = clustering.index.long().numpy()
    purity = np.mean([np.bincount(index[membership.numpy() == group]).max() / (membership == group).sum().item()
                      for group in range(40)])
    assert purity > 0.9
    again, _ = cluster_field(vectors, counts, clusters=40, head=0.1, seed=0, local_trials=1)
    assert torch.equal(again.index, clustering.index)  # deterministic per seed
    with pytest.raises(ValueError, match="local_trials"):
        Settings(local_trials=0)


def test_minibatch_clusters_the_head_too():
    vectors, counts, _ = grouped_table()
    clustering, facts = cluster_field(vectors, counts, clusters=40, method="minibatch", seed=0)
    assert clustering.clusters <= 40 and facts["distortion"] < 0.2


def test_a_field_nobody_saw_reads_only_its_fallback():
    clustering, facts = cluster_field(torch.randn(30, 8), torch.zeros(30, dtype=torch.long), clusters=4)
    assert facts["seen"] == 0 and clustering.clusters == 0 and bool((clustering.index == 0).all())


def test_the_plan_meets_the_byte_target_and_keeps_small_fields():
    sizes, dim = [20_000, 5_000, 300, 7], 32
    plan = plan_clusters(sizes, sizes, dim, ratio=20)
    full = sum(size * dim * 4 for size in sizes)
    spent = sum(size * dim * 4 if clusters is None else compressed_bytes(size, clusters, dim)
                for size, clusters in zip(sizes, plan, strict=True))
    assert spent <= full / 20
    assert plan[3] is None  # 7 features: a clustered copy would not be smaller
    assert plan[0] > plan[1] > 0  # clusters follow the field's size
    assert plan[2] >= 32  # a small field keeps at least 32 clusters
    assert plan_clusters(sizes, sizes, dim, ratio=1) == [None, None, None, None] or spent  # nothing to gain at 1x


def test_compressed_bytes_count_centroids_and_the_narrowest_index():
    assert compressed_bytes(1000, 255, 16) == 256 * 16 * 4 + 1000 * 1
    assert compressed_bytes(1000, 256, 16) == 257 * 16 * 4 + 1000 * 2
    assert compressed_bytes(100_000, 40_000, 8) == 40_001 * 8 * 4 + 100_000 * 4


def test_settings_refuse_nonsense():
    for bad in ({"ratio": 0.5}, {"head": 0}, {"head": 1.5}, {"method": "dbscan"}):
        with pytest.raises(ValueError):
            Settings(**bad)


@pytest.fixture(scope="module")
def trained():
    from components.embeddings.datasets import synthetic_ctr
    from components.embeddings.workload import DLRMSynthetic, dlrm_config

    data = synthetic_ctr(0, sizes=(3000, 800, 40, 3), rows=30_000, test_rows=8_000)
    config = dlrm_config(data, hidden=32, dim=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DLRMSynthetic.from_config(config)
    with torch.no_grad():
        for embedding, counts in zip(model.embeddings, data.counts(), strict=True):
            embedding.counts.copy_(counts)
    fit(model, data.x_train, data.y_train, epochs=2, batch_size=512)
    for embedding in model.embeddings:
        embedding.refresh_fallback()
    return data, config, model


def test_compressing_a_model_shrinks_it_and_keeps_its_auc(trained):
    data, config, model = trained
    before = evaluate(model, data.x_test, data.y_test)
    result = compress_model(model, config, Settings(ratio=10))
    assert result.ratio >= 10 * 0.99 and result.bytes_after == result.model.embedding_bytes()
    assert [field["clusters"] is None for field in result.config["fields"]] == \
           [not isinstance(embedding, ClusteredEmbedding) for embedding in result.model.embeddings]
    after = evaluate(result.model, data.x_test, data.y_test)
    assert before["auc"] > 0.7
    assert after["auc"] > before["auc"] - 0.03
    # The MLP is the source's, untouched; full fields keep their weights.
    assert torch.equal(result.model.top[0].weight, model.top[0].weight)
    for source, compressed in zip(model.embeddings, result.model.embeddings, strict=True):
        if isinstance(compressed, FullEmbedding):
            assert torch.equal(source.weight, compressed.weight)


def test_out_of_range_ids_get_the_fallback_in_both_models(trained):
    data, config, model = trained
    result = compress_model(model, config, Settings(ratio=10))
    rows = data.x_test[:4].clone()
    weird = rows.clone()
    weird[:, 0] = torch.tensor([-1, 3000, 10**9, -(10**12)])
    for candidate in (model, result.model):
        field = candidate.embeddings[0]
        fallback = field.weight[field.size] if isinstance(field, FullEmbedding) else field.centroids[field.fallback]
        vectors = candidate.vectors(weird)[:, 0]
        assert torch.equal(vectors, fallback.expand_as(vectors))
        assert bool(torch.isfinite(predict(candidate, weird)).all())


def test_per_field_hybrids_and_centroid_fine_tuning(trained):
    data, config, model = trained
    result = compress_model(model, config, Settings(ratio=20))
    mixed = hybrid(model, result.model, 0)
    assert mixed.embeddings[0] is result.model.embeddings[0] and mixed.embeddings[1] is model.embeddings[1]
    top = result.model.top[0].weight.clone()
    centroids = [parameter.detach().clone() for parameter in centroid_parameters(result.model)]
    before = evaluate(result.model, data.x_train[:8000], data.y_train[:8000])["logloss"]
    fit(result.model, data.x_train, data.y_train, epochs=1, max_steps=40, lr=0.003,
        parameters=centroid_parameters(result.model))
    after = evaluate(result.model, data.x_train[:8000], data.y_train[:8000])["logloss"]
    assert torch.equal(result.model.top[0].weight, top)  # only the centroids learned
    assert any(not torch.equal(old, new) for old, new in zip(centroids, centroid_parameters(result.model),
                                                             strict=True))
    assert after < before


def test_only_a_model_of_full_tables_can_be_compressed(trained):
    _, config, model = trained
    result = compress_model(model, config, Settings(ratio=10))
    with pytest.raises(ValueError, match="full tables"):
        compress_model(result.model, result.config, Settings(ratio=10))


def test_clustered_models_rebuild_from_their_config():
    fields = [{"name": "a", "size": 300, "clusters": 20}, {"name": "b", "size": 10, "clusters": None}]
    model = DLRM(fields, 8, 16)
    assert isinstance(model.embeddings[0], ClusteredEmbedding) and model.embeddings[0].index.dtype == torch.uint8
    assert model(torch.tensor([[1, 2], [299, 9]])).shape == (2, 1)
