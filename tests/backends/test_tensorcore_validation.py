"""Bad input to the TensorCore backend gets an error naming what is wrong."""

import numpy as np
import pytest
import tensorflow as tf

import backends
from backends.inputs import InvalidInputError

E = tf.tpu.experimental.embedding


def _emb(**kwargs):
  table = E.TableConfig(23, 7, combiner="mean", name="users")
  config = {
    "user_id": E.FeatureConfig(table),
    "history": E.FeatureConfig(table, max_sequence_length=3),
  }
  return backends.TensorCoreEmbedding(config, E.SGD(0.1), **kwargs), table


def _history():
  return tf.ragged.constant([[1, 2], [3], [4, 5, 6]], dtype=tf.int64)


@pytest.mark.parametrize("bad_id,row", [(23, 1), (-1, 2), (1204, 0)])
def test_out_of_range_id_names_feature_table_id_and_row(bad_id, row):
  emb, _ = _emb()
  ids = [0, 1, 2]
  ids[row] = bad_id
  with pytest.raises(
    InvalidInputError,
    match=rf"feature 'user_id' \(table 'users', vocabulary_size=23\) "
    rf"got id {bad_id} at batch row {row}; ids must be in \[0, 23\)",
  ):
    emb({"user_id": tf.constant(ids), "history": _history()})


def test_out_of_range_id_fails_inside_tf_function_too():
  emb, _ = _emb()
  emb.build()
  step = tf.function(lambda f: emb(f))
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"feature `history` \(table `users`.* got id 99 at batch row 1",
  ):
    step(
      {
        "user_id": tf.constant([0, 1, 2]),
        "history": tf.ragged.constant([[1], [2, 99], []], dtype=tf.int64),
      }
    )


@pytest.mark.parametrize("compiled_bags", [False, True], ids=["flat", "static"])
def test_a_traced_lookup_checks_every_feature_in_one_assertion(compiled_bags):
  """One `tf.cond` for all of a lookup's value checks (each feature's ids
  and weights), failing with the first failing feature's message, in
  config order, whichever others fail too."""
  table = E.TableConfig(23, 7, combiner="sum", name="users")
  config = {f"f{i}": E.FeatureConfig(table, name=f"f{i}") for i in range(4)}
  emb = backends.TensorCoreEmbedding(
    config, E.SGD(0.1), bag_widths=2, static_shapes=compiled_bags
  )
  emb.build()

  def bags(bad):
    return {
      f"f{i}": tf.ragged.constant(
        [[1, 99 if i in bad else 2], [3]], dtype=tf.int64
      )
      for i in range(4)
    }

  step = tf.function(lambda f: emb(f))
  graph = step.get_concrete_function(bags(())).graph
  conds = [
    op for op in graph.get_operations() if op.type in ("If", "StatelessIf")
  ]
  assert len(conds) == 1, [op.name for op in conds]
  assert all(np.isfinite(a.numpy()).all() for a in step(bags(())).values())
  for bad in [(2,), (1, 3), (3, 0)]:
    first = min(bad)
    with pytest.raises(
      tf.errors.InvalidArgumentError,
      match=rf"feature `f{first}` \(table `users`.* got id 99 at batch row 0",
    ):
      step(bags(bad))


def test_drop_policy_removes_and_counts_invalid_ids():
  emb, table = _emb(invalid_ids="drop")
  values = emb.embedding_tables[table].numpy()
  out = emb(
    {
      "user_id": tf.ragged.constant([[1, 40], [-3], [2]], dtype=tf.int64),
      "history": _history(),
    }
  )
  np.testing.assert_allclose(out["user_id"][0], values[1], rtol=1e-6)
  np.testing.assert_array_equal(out["user_id"][1], np.zeros(7))
  assert emb.input_stats()["invalid_ids"]["user_id"] == 2


def test_oov_policy_maps_to_last_row():
  emb, table = _emb(invalid_ids="oov")
  values = emb.embedding_tables[table].numpy()
  out = emb({"user_id": tf.constant([5, 99, -1]), "history": _history()})
  np.testing.assert_allclose(out["user_id"][1:], values[[22, 22]], rtol=1e-6)
  assert emb.input_stats()["invalid_ids"]["user_id"] == 2


def test_validation_can_be_switched_off_per_feature():
  """validate_weights_and_indices=False: a negative weight is used as given."""
  table = E.TableConfig(23, 7, combiner="sum", name="t")
  emb = backends.TensorCoreEmbedding(
    {"f": E.FeatureConfig(table, validate_weights_and_indices=False)},
    E.SGD(0.1),
  )
  values = emb.embedding_tables[table].numpy()
  ids = tf.ragged.constant([[1, 2]], dtype=tf.int64)
  out = emb({"f": ids}, {"f": tf.ragged.constant([[1.0, -0.5]])})
  np.testing.assert_allclose(
    out["f"][0], values[1] - 0.5 * values[2], rtol=1e-6
  )


def test_unknown_id_policy():
  with pytest.raises(ValueError, match="invalid_ids='zero'.*error, drop, oov"):
    _emb(invalid_ids="zero")


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -0.5])
def test_bad_weights(weight):
  emb, _ = _emb()
  ids = tf.ragged.constant([[1, 2], [3], [4]], dtype=tf.int64)
  w = tf.ragged.constant([[1.0, weight], [1.0], [1.0]])
  with pytest.raises(InvalidInputError, match="feature 'user_id'.*got weight"):
    emb(
      {"user_id": ids, "history": _history()}, {"user_id": w, "history": None}
    )


def test_weights_on_dense_ids():
  emb, _ = _emb()
  with pytest.raises(InvalidInputError, match="'user_id'.*dense tensor"):
    emb(
      {"user_id": tf.constant([1, 2, 3]), "history": _history()},
      {"user_id": tf.constant([1.0, 1.0, 1.0]), "history": None},
    )


def test_weights_of_another_kind():
  emb, _ = _emb()
  ids = tf.ragged.constant([[1, 2], [3], [4]], dtype=tf.int64)
  with pytest.raises(
    InvalidInputError, match="SparseTensor but the ids are a RaggedTensor"
  ):
    emb(
      {"user_id": ids, "history": _history()},
      {"user_id": tf.ones_like(ids, tf.float32).to_sparse(), "history": None},
    )


def test_weights_on_sequence_feature():
  emb, _ = _emb()
  h = _history()
  with pytest.raises(
    InvalidInputError,
    match=r"'history' \(table 'users'.*\) is a sequence feature",
  ):
    emb(
      {"user_id": tf.constant([1, 2, 3]), "history": h},
      {"user_id": None, "history": tf.ones_like(h, tf.float32)},
    )


def test_weights_with_other_shape():
  emb, _ = _emb()
  ids = tf.ragged.constant([[1, 2], [3], [4]], dtype=tf.int64)
  w = tf.ragged.constant([[1.0], [1.0], [1.0]])
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'user_id'.*different numbers"
  ):
    emb(
      {"user_id": ids, "history": _history()}, {"user_id": w, "history": None}
    )


def test_float_ids():
  emb, _ = _emb()
  with pytest.raises(
    InvalidInputError, match="'user_id'.*dtype float32.*int32 or int64"
  ):
    emb({"user_id": tf.constant([1.0, 2.0, 3.0]), "history": _history()})


def test_ragged_rank_3():
  emb, _ = _emb()
  ids = tf.ragged.constant([[[1], [2, 3]], [[4]], [[5]]], dtype=tf.int64)
  with pytest.raises(
    InvalidInputError, match="'user_id'.*RaggedTensor of rank 3"
  ):
    emb({"user_id": ids, "history": _history()})


def test_dense_rank_3():
  emb, _ = _emb()
  with pytest.raises(InvalidInputError, match=r"'user_id'.*shape \(3, 1, 1\)"):
    emb({"user_id": tf.zeros([3, 1, 1], tf.int64), "history": _history()})


def test_features_structure_mismatch_names_missing_and_extra_keys():
  emb, _ = _emb()
  with pytest.raises(
    ValueError, match=r"missing \['history'\], unexpected \['item_id'\]"
  ):
    emb({"user_id": tf.constant([1]), "item_id": tf.constant([2])})


def test_empty_batch_gives_empty_activations():
  emb, _ = _emb()
  out = emb(
    {
      "user_id": tf.zeros([0], tf.int64),
      "history": tf.ragged.constant([], dtype=tf.int64, ragged_rank=1),
    }
  )
  assert out["user_id"].shape == (0, 7)
  assert out["history"].shape == (0, 3, 7)


def test_configuration_errors():
  table = E.TableConfig(23, 7, name="t")
  with pytest.raises(ValueError, match="table 't' has no optimizer"):
    backends.TensorCoreEmbedding({"f": E.FeatureConfig(table)})
  twin = E.TableConfig(23, 7, name="t")
  with pytest.raises(ValueError, match="both named 't'.*share one TableConfig"):
    backends.TensorCoreEmbedding(
      {"f": E.FeatureConfig(table), "g": E.FeatureConfig(twin)}, E.SGD(0.1)
    )
  with pytest.raises(
    ValueError, match="bag_widths names unknown features \\['nope'\\]"
  ):
    backends.TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)}, E.SGD(0.1), bag_widths={"nope": 3}
    )
  with pytest.raises(
    TypeError, match="feature_config\\['f'\\] is a TableConfig"
  ):
    backends.TensorCoreEmbedding({"f": table}, E.SGD(0.1))
