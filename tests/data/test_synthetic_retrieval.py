"""SyntheticRetrieval: contract, corpus, and the exact best hit rate against sampled data."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import SyntheticRetrieval, SyntheticRetrievalConfigError

SMALL = dict(
  num_users=53, num_items=23, factor_dim=7, num_genres=11, max_genres=3
)


def test_batch_contract_and_feature_lists():
  source = SyntheticRetrieval(**SMALL)
  features, labels = next(iter(source.dataset(5)))
  cat = features["categorical"]
  assert set(cat) == set(source.query_features) | set(source.candidate_features)
  assert source.candidate_id_feature in source.candidate_features
  for name in ("user_id", "user_age", "item_id"):
    assert cat[name].shape == (5,) and cat[name].dtype == tf.int64
  genres = cat["item_genres"]
  assert (
    isinstance(genres, tf.RaggedTensor) and genres.row_splits.dtype == tf.int64
  )
  assert (
    1 <= genres.row_lengths().numpy().min()
    and genres.row_lengths().numpy().max() <= 3
  )
  assert labels.shape == (5,) and np.all(labels.numpy() == 1.0)
  q = features["candidate_sampling_probability"]
  assert q.shape == (5,) and q.dtype == tf.float32
  want = source.item_probabilities()[cat["item_id"].numpy()]
  np.testing.assert_allclose(q.numpy(), want, rtol=1e-6)
  for spec in source.feature_specs:
    ids = cat[spec.name]
    flat = (
      ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    ).numpy()
    assert flat.min() >= 0 and flat.max() < spec.vocabulary_size


def test_candidates_cover_the_corpus_once_with_consistent_features():
  source = SyntheticRetrieval(**SMALL)
  items, genres = [], {}
  for batch in source.candidates(5):
    ids = batch["categorical"]["item_id"].numpy()
    items += ids.tolist()
    for i, g in zip(ids, batch["categorical"]["item_genres"].to_list()):
      genres[int(i)] = g
  assert sorted(items) == list(range(23))
  # An item's genres in training batches equal its genres in the corpus.
  features, _ = source.examples(tf.range(200, dtype=tf.int64))
  for i, g in zip(
    features["categorical"]["item_id"].numpy(),
    features["categorical"]["item_genres"].to_list(),
  ):
    assert genres[int(i)] == g


def test_interactions_follow_the_planted_marginal():
  source = SyntheticRetrieval(**SMALL)
  n = 40_000
  features, _ = source.examples(tf.range(n, dtype=tf.int64))
  freq = (
    np.bincount(features["categorical"]["item_id"].numpy(), minlength=23) / n
  )
  q = source.item_probabilities()
  assert q.sum() == pytest.approx(1.0)
  np.testing.assert_allclose(freq, q, atol=4 * np.sqrt(q.max() / n))


@pytest.mark.parametrize("k", [1, 5, 10])
def test_bayes_ranking_reaches_best_hit_rate(k):
  source = SyntheticRetrieval(**SMALL)
  n = 20_000
  features, _ = source.examples(tf.range(n, dtype=tf.int64), training=False)
  users = features["categorical"]["user_id"].numpy()
  items = features["categorical"]["item_id"].numpy()
  scores = source.true_affinities(users)  # the Bayes ranking
  rank = (scores > scores[np.arange(n), items][:, None]).sum(axis=1)
  hit = np.mean(rank < k)
  best = source.best_hit_rate(k)
  assert hit == pytest.approx(best, abs=4 * np.sqrt(best * (1 - best) / n))
  # Popularity ranking, empirically and exactly, is worse than Bayes.
  top = np.argsort(-source.item_probabilities())[:k]
  pop = source.popularity_hit_rate(k)
  assert np.mean(np.isin(items, top)) == pytest.approx(
    pop, abs=4 * np.sqrt(pop * (1 - pop) / n)
  )
  assert pop <= best


def test_hit_rates_are_monotone_and_reach_one():
  source = SyntheticRetrieval(**SMALL)
  rates = [source.best_hit_rate(k) for k in (1, 5, 10, 23)]
  assert rates == sorted(rates) and rates[-1] == pytest.approx(1.0)
  assert source.popularity_hit_rate(23) == pytest.approx(1.0)


def test_deterministic_and_sharded_exactly_once():
  a = SyntheticRetrieval(seed=1, num_examples=37, **SMALL)
  b = SyntheticRetrieval(seed=1, num_examples=37, **SMALL)
  key = lambda f: list(
    zip(
      f["categorical"]["user_id"].numpy().tolist(),
      f["categorical"]["item_id"].numpy().tolist(),
    )
  )
  whole = [
    p
    for f, _ in a.dataset(5, drop_remainder=False, repeat=False)
    for p in key(f)
  ]
  assert whole == [
    p
    for f, _ in b.dataset(5, drop_remainder=False, repeat=False)
    for p in key(f)
  ]
  assert whole == key(a.examples(tf.range(37, dtype=tf.int64))[0])
  shards = []
  for pipeline in range(2):
    ctx = tf.distribute.InputContext(2, pipeline, 2)
    shards += [
      p
      for f, _ in a.dataset(
        5, input_context=ctx, drop_remainder=False, repeat=False
      )
      for p in key(f)
    ]
  assert sorted(shards) == sorted(whole)


def test_too_large_is_a_clear_error():
  with pytest.raises(
    SyntheticRetrievalConfigError, match="num_users \\* num_items"
  ):
    SyntheticRetrieval(num_users=1 << 13, num_items=1 << 12)
