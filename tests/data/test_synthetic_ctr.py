"""SyntheticCTR: batch contract, determinism, Zipf skew, and the planted optimum."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import SyntheticConfigError, SyntheticCTR, _random
from recsys.errors import SettingsError

SMALL = dict(
  num_dense=3,
  vocab_sizes=(23, 11, 7),
  multi_hot_sizes=(1, 4, 2),
  weighted=(False, True, False),
  oracle_examples=1 << 15,
)


def rows(features, labels):
  """One hashable tuple per example (for set comparisons)."""
  cat = features["categorical"]
  columns = [np.round(features["dense"].numpy(), 5).tolist()]
  for name in sorted(cat):
    ids = cat[name]
    columns.append(
      ids.to_list()
      if isinstance(ids, tf.RaggedTensor)
      else ids.numpy().tolist()
    )
  columns.append(labels.numpy().tolist())
  return [tuple(str(c) for c in row) for row in zip(*columns)]


def test_batch_contract():
  source = SyntheticCTR(**SMALL)
  features, labels = next(iter(source.dataset(5)))
  assert (
    features["dense"].shape == (5, 3) and features["dense"].dtype == tf.float32
  )
  assert labels.shape == (5,) and labels.dtype == tf.float32
  assert set(np.unique(labels.numpy())) <= {0.0, 1.0}
  specs = {s.name: s for s in source.feature_specs}
  assert list(specs) == ["C1", "C2", "C3"]
  c1, c2, c3 = (features["categorical"][n] for n in ("C1", "C2", "C3"))
  assert isinstance(c1, tf.Tensor) and c1.shape == (5,) and c1.dtype == tf.int64
  for bag, m in ((c2, 4), (c3, 2)):
    assert isinstance(bag, tf.RaggedTensor) and bag.dtype == tf.int64
    assert bag.row_splits.dtype == tf.int64 and bag.shape[0] == 5
    lengths = bag.row_lengths().numpy()
    assert lengths.min() >= 1 and lengths.max() <= m
  assert (
    specs["C2"].multi_hot and specs["C2"].max_ids == 4 and specs["C2"].weighted
  )
  assert not specs["C1"].multi_hot and specs["C1"].max_ids == 1
  assert set(features["weights"]) == {"C2"}
  w = features["weights"]["C2"]
  np.testing.assert_array_equal(w.row_splits.numpy(), c2.row_splits.numpy())
  assert w.dtype == tf.float32 and 0.5 <= w.flat_values.numpy().min()
  assert w.flat_values.numpy().max() < 1.5


def test_ids_in_range_and_dense_like_criteo():
  source = SyntheticCTR(**SMALL)
  features, _ = source.examples(tf.range(4000, dtype=tf.int64))
  for spec in source.feature_specs:
    ids = features["categorical"][spec.name]
    flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    assert (
      0 <= int(tf.reduce_min(flat))
      and int(tf.reduce_max(flat)) < spec.vocabulary_size
    )
  dense = features["dense"].numpy()
  # log(1 + integer count): non-negative and exp(x) - 1 is an integer.
  assert dense.min() >= 0.0
  counts = np.expm1(dense.astype(np.float64))
  np.testing.assert_allclose(counts, np.round(counts), rtol=1e-4, atol=1e-4)


def test_no_dense_features():
  source = SyntheticCTR(
    num_dense=0, vocab_sizes=(23, 7), multi_hot_sizes=1, oracle_examples=1 << 12
  )
  features, labels = next(iter(source.dataset(5)))
  assert (
    "dense" not in features
    and "weights" not in features
    and labels.shape == (5,)
  )
  assert source.num_dense == 0


def test_zipf_skew_of_id_frequencies():
  source = SyntheticCTR(
    num_dense=0,
    vocab_sizes=(23,),
    multi_hot_sizes=1,
    zipf_exponent=1.05,
    oracle_examples=1 << 12,
  )
  n = 100_000
  features, _ = source.examples(tf.range(n, dtype=tf.int64))
  counts = (
    np.sort(np.bincount(features["categorical"]["C1"].numpy(), minlength=23))[
      ::-1
    ]
    / n
  )
  pmf = np.sort(_random.zipf_pmf(23, 1.05))[::-1]
  np.testing.assert_allclose(counts, pmf, atol=4 * np.sqrt(pmf.max() / n))


def test_deterministic_from_seed_and_independent_of_batch_size():
  a, b = SyntheticCTR(seed=3, **SMALL), SyntheticCTR(seed=3, **SMALL)
  c = SyntheticCTR(seed=4, **SMALL)
  index = tf.range(35, dtype=tf.int64)
  assert rows(*a.examples(index)) == rows(*b.examples(index))
  assert rows(*a.examples(index)) != rows(*c.examples(index))
  # The eval split is different data from the training split.
  assert rows(*a.examples(index)) != rows(*a.examples(index, training=False))
  # Batches are the same examples whatever the batch size.
  take = lambda bs, n: [r for f, l in a.dataset(bs).take(n) for r in rows(f, l)]
  assert take(5, 7) == take(7, 5) == rows(*a.examples(index))


def test_sized_source_shards_cover_every_example_once():
  source = SyntheticCTR(num_examples=53, **SMALL)
  whole = [
    r
    for f, l in source.dataset(5, drop_remainder=False, repeat=False)
    for r in rows(f, l)
  ]
  assert len(whole) == 53
  shards = []
  for pipeline in range(2):
    ctx = tf.distribute.InputContext(
      num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
    )
    shards += [
      r
      for f, l in source.dataset(
        5, input_context=ctx, drop_remainder=False, repeat=False
      )
      for r in rows(f, l)
    ]
  assert sorted(shards) == sorted(whole)
  # drop_remainder keeps static shapes and drops only the last partial batch.
  sizes = [l.shape[0] for _, l in source.dataset(5, repeat=False)]
  assert sizes == [5] * 10
  # Training on a sized source repeats.
  assert len(list(source.dataset(5).take(25))) == 25


def test_labels_follow_the_planted_probabilities():
  source = SyntheticCTR(ctr=0.3, **SMALL)
  features, labels = source.examples(
    tf.range(60_000, dtype=tf.int64), training=False
  )
  p, y = source.probabilities(features).numpy(), labels.numpy()
  assert y.mean() == pytest.approx(0.3, abs=0.01)
  edges = np.quantile(p, np.linspace(0, 1, 11))
  bins = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
  for b in range(10):
    sel = bins == b
    se = np.sqrt(p[sel].mean() * (1 - p[sel].mean()) / sel.sum())
    assert abs(y[sel].mean() - p[sel].mean()) < 4 * se + 1e-3


def test_oracle_reaches_reported_optimum_and_constant_gets_half():
  source = SyntheticCTR(
    oracle_examples=1 << 16
  )  # the default experiment's config
  assert 0.75 <= source.bayes_auc <= 0.9
  assert source.bayes_logloss < source.constant_logloss
  features, labels = next(iter(source.dataset(1 << 16, training=False)))
  p = source.probabilities(features)
  auc = tf.keras.metrics.AUC(num_thresholds=10_000)
  auc.update_state(labels, p)
  assert float(auc.result()) == pytest.approx(source.bayes_auc, abs=0.01)
  bce = float(tf.keras.losses.BinaryCrossentropy()(labels[:, None], p[:, None]))
  assert bce == pytest.approx(source.bayes_logloss, abs=0.01)
  constant = tf.keras.metrics.AUC(num_thresholds=10_000)
  constant.update_state(
    labels, tf.fill(tf.shape(p), float(tf.reduce_mean(labels)))
  )
  assert float(constant.result()) == pytest.approx(0.5, abs=1e-6)
  # A worse-than-Bayes predictor (noisy logits) scores below the optimum.
  noisy = tf.keras.metrics.AUC(num_thresholds=10_000)
  noise = tf.random.stateless_normal(tf.shape(p), seed=[1, 2])
  noisy.update_state(
    labels, tf.sigmoid(source.planted_logits(features) + 1.5 * noise)
  )
  assert float(noisy.result()) < source.bayes_auc - 0.03


def test_logit_std_controls_difficulty():
  easy = SyntheticCTR(logit_std=2.5, **SMALL)
  hard = SyntheticCTR(logit_std=0.5, **SMALL)
  assert 0.5 < hard.bayes_auc < easy.bayes_auc


def test_config_errors_are_clear():
  with pytest.raises(
    SyntheticConfigError, match="multi_hot_sizes has 2 entries"
  ):
    SyntheticCTR(vocab_sizes=(5, 6, 7), multi_hot_sizes=(1, 2))
  with pytest.raises(SettingsError, match="ctr must be a number in"):
    SyntheticCTR(ctr=1.5, **{k: v for k, v in SMALL.items()})


def test_hashed_factors_equal_the_precomputed_table():
  table = SyntheticCTR(**SMALL)
  hashed = SyntheticCTR(max_factor_table_size=0, **SMALL)
  features, labels = table.examples(tf.range(300, dtype=tf.int64))
  features2, labels2 = hashed.examples(tf.range(300, dtype=tf.int64))
  assert rows(features, labels) == rows(features2, labels2)
  np.testing.assert_allclose(
    hashed.probabilities(features), table.probabilities(features), rtol=1e-5
  )


def test_sized_source_smaller_than_a_batch_is_a_clear_error():
  source = SyntheticCTR(num_examples=3, **SMALL)
  with pytest.raises(SyntheticConfigError, match="no full batch of 5"):
    source.dataset(5)
  assert [
    l.shape[0] for _, l in source.dataset(5, drop_remainder=False, repeat=False)
  ] == [3]
