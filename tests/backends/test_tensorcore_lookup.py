"""TensorCore lookups against TF's own TPUEmbeddingForServing and NumPy."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import backends
from backends import inputs as inputs_lib

E = tf.tpu.experimental.embedding
VOCAB, DIM, BATCH = 23, 7, 5


def _ragged_ids(rng, batch=BATCH, max_len=4, vocab=VOCAB, empty_row=1):
  rows = [
    list(rng.integers(0, vocab, size=rng.integers(1, max_len + 1)))
    for _ in range(batch)
  ]
  rows[empty_row] = []  # an empty bag must give zeros
  return tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1)


def _ragged_weights(rng, ids):
  return tf.RaggedTensor.from_row_splits(
    tf.constant(rng.uniform(0.1, 2.0, size=ids.values.shape[0]), tf.float32),
    ids.row_splits,
  )


def _as_kind(ragged, kind):
  if kind == "ragged":
    return ragged
  if kind == "sparse":
    return ragged.to_sparse()
  raise ValueError(kind)


def _serving_with_same_tables(feature_config, emb):
  """TF's serving mid-level API holding our tables' values."""
  serving = E.TPUEmbeddingForServing(feature_config, E.SGD(0.1))
  serving.build()
  for table, var in emb.embedding_tables.items():
    serving.embedding_tables[table].assign(var)
  return serving


@pytest.mark.parametrize(
  "kind,combiner,weighted",
  [
    (k, c, w)
    for k, c, w in itertools.product(
      ["ragged", "sparse"], ["sum", "mean", "sqrtn"], [False, True]
    )
  ],
)
def test_bag_lookup_equals_tf_serving(kind, combiner, weighted):
  rng = np.random.default_rng(0)
  table = E.TableConfig(VOCAB, DIM, combiner=combiner, name="t")
  config = {"f": E.FeatureConfig(table)}
  emb = backends.TensorCoreEmbedding(config, E.SGD(0.1))
  ids = _ragged_ids(rng)
  weights = _ragged_weights(rng, ids) if weighted else None
  features = {"f": _as_kind(ids, kind)}
  w = {"f": _as_kind(weights, kind)} if weighted else None
  got = emb(features, w)["f"]
  want = _serving_with_same_tables(config, emb)(features, w)["f"]
  assert got.shape == (BATCH, DIM)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got[1], np.zeros(DIM))  # the empty bag


def test_shared_table_and_mixed_kinds_equal_tf_serving():
  rng = np.random.default_rng(1)
  shared = E.TableConfig(VOCAB, DIM, combiner="mean", name="shared")
  other = E.TableConfig(11, DIM, combiner="sqrtn", name="other")
  config = {
    "a": E.FeatureConfig(shared),
    "b": E.FeatureConfig(shared),
    "c": E.FeatureConfig(other),
    "d": E.FeatureConfig(other),
  }
  emb = backends.TensorCoreEmbedding(config, E.Adagrad(0.1))
  a = _ragged_ids(rng)
  features = {
    "a": a,
    "b": _ragged_ids(rng, empty_row=3).to_sparse(),
    "c": _ragged_ids(rng, vocab=11),
    "d": tf.constant([3, 0, 10, 4, 4]),
  }
  weights = {"a": _ragged_weights(rng, a), "b": None, "c": None, "d": None}
  got = emb(features, weights)
  want = _serving_with_same_tables(config, emb)(features, weights)
  assert len(emb.embedding_tables) == 2
  for name in config:
    np.testing.assert_allclose(
      got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name
    )


def test_dense_ids_one_per_example_and_bags():
  """Dense [B] and [B, 1] give [B, D]; dense [B, N] is a bag of N ids."""
  table = E.TableConfig(VOCAB, DIM, combiner="mean", name="t")
  config = {"f": E.FeatureConfig(table)}
  emb = backends.TensorCoreEmbedding(config, E.SGD(0.1))
  values = emb.embedding_tables[table].numpy()
  ids = np.array([[1, 2, 2], [0, 5, 22], [7, 7, 7], [3, 4, 5], [9, 9, 1]])
  np.testing.assert_allclose(
    emb({"f": tf.constant(ids[:, 0])})["f"], values[ids[:, 0]], rtol=1e-6
  )
  np.testing.assert_allclose(
    emb({"f": tf.constant(ids[:, :1])})["f"], values[ids[:, 0]], rtol=1e-6
  )
  np.testing.assert_allclose(
    emb({"f": tf.constant(ids, tf.int32)})["f"],
    values[ids].mean(axis=1),
    rtol=1e-6,
    atol=1e-7,
  )


@pytest.mark.parametrize("kind", ["ragged", "sparse", "dense"])
def test_sequence_feature_pads_and_truncates(kind):
  seq_len = 3
  table = E.TableConfig(VOCAB, DIM, name="t")
  config = {"s": E.FeatureConfig(table, max_sequence_length=seq_len)}
  emb = backends.TensorCoreEmbedding(config, E.SGD(0.1))
  values = emb.embedding_tables[table].numpy()
  rows = [[1, 2, 3, 4, 5], [6], [], [7, 8, 9], [10, 11]]
  if kind == "dense":
    rows = [
      [1, 2, 3, 4],
      [6, 7, 8, 9],
      [0, 0, 0, 0],
      [7, 8, 9, 1],
      [10, 11, 1, 2],
    ]
    inp = tf.constant(rows)
  else:
    inp = _as_kind(tf.ragged.constant(rows, dtype=tf.int64), kind)
  got = emb({"s": inp})["s"].numpy()
  want = np.zeros((len(rows), seq_len, DIM), np.float32)
  for b, row in enumerate(rows):
    for p, i in enumerate(row[:seq_len]):
      want[b, p] = values[i]
  assert got.shape == (len(rows), seq_len, DIM)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  if kind != "dense":  # TF's serving API has no dense sequence features
    ref = _serving_with_same_tables(config, emb)({"s": inp})["s"]
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_output_shape_as_in_tf():
  table = E.TableConfig(VOCAB, DIM, combiner="sum", name="t")
  config = {"f": E.FeatureConfig(table, output_shape=[BATCH])}
  emb = backends.TensorCoreEmbedding(config, E.SGD(0.1))
  ids = _ragged_ids(np.random.default_rng(3))
  got = emb({"f": ids})["f"]
  want = _serving_with_same_tables(config, emb)({"f": ids})["f"]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_padded_bags_equal_ragged_and_trace_once(combiner):
  """preprocess() gives static shapes: same numbers, one trace."""
  rng = np.random.default_rng(4)
  table = E.TableConfig(VOCAB, DIM, combiner=combiner, name="t")
  config = {"f": E.FeatureConfig(table)}
  emb = backends.TensorCoreEmbedding(config, E.SGD(0.1), bag_widths=4)
  emb.build()

  @tf.function
  def lookup(features):
    return emb(features)["f"]

  for max_len in (2, 3, 4):
    ids = _ragged_ids(rng, max_len=max_len)
    weights = _ragged_weights(rng, ids)
    padded, no_weights = emb.preprocess({"f": ids}, {"f": weights})
    assert no_weights is None
    assert isinstance(padded["f"], inputs_lib.PaddedBags)
    assert padded["f"].ids.shape == (BATCH, 4)
    np.testing.assert_allclose(
      lookup(padded), emb({"f": ids}, {"f": weights})["f"], rtol=1e-6, atol=1e-6
    )
  assert lookup.experimental_get_tracing_count() == 1


def test_truncation_is_counted_not_silent():
  table = E.TableConfig(VOCAB, DIM, combiner="sum", name="t")
  emb = backends.TensorCoreEmbedding(
    {"f": E.FeatureConfig(table)}, E.SGD(0.1), bag_widths=2
  )
  ids = tf.ragged.constant([[1, 2, 3, 4], [5], [6, 7, 8]], dtype=tf.int64)
  padded, _ = emb.preprocess({"f": ids})
  got = emb(padded)["f"].numpy()
  values = emb.embedding_tables[table].numpy()
  np.testing.assert_allclose(got[0], values[1] + values[2], rtol=1e-6)
  assert emb.input_stats()["truncated_ids"]["f"] == 3
