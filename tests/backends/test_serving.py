"""Tests of backends/mid_level/serving.py: lookups vs TF's serving lookup and
NumPy, export.

Where TF's `serving_embedding_lookup` already returns the project's shapes
(dense `[B]`, sparse and ragged bags, sequences) it is the reference; for
dense `[B, N]` ids (TF: `[B, N, D]`, uncombined) the reference is TF's output
combined with the NumPy combiner. `serving_lookup` on a training backend's
tables (in place) and `ServingEmbedding.from_backend` (a copy) are checked
against that backend's own lookups. The export test trains with `tensorcore`,
restores the checkpoint into `serving`, exports, and compares the scores of
the SavedModel loaded in a fresh Python process (without recsys) with the
trained model's.
"""

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
from backends.mid_level import common as mid_level  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base  # noqa: E402
from backends import checkpoint as ckpt  # noqa: E402
from backends.mid_level.serving import (
  ServingEmbedding,
  export_saved_model,
  serving_lookup,
)  # noqa: E402

E = tf.tpu.experimental.embedding
B = 5


def _table(combiner, vocab=23, dim=7, name="t"):
  init = tf.constant_initializer(
    np.random.default_rng(vocab * dim)
    .normal(size=(vocab, dim))
    .astype(np.float32)
  )
  return E.TableConfig(
    vocab, dim, initializer=init, combiner=combiner, name=name
  )


def _ragged(rng, vocab=23, max_len=4):
  lengths = rng.integers(1, max_len + 1, size=B)
  return tf.RaggedTensor.from_row_lengths(
    rng.integers(0, vocab, size=lengths.sum()).astype(np.int64), lengths
  )


def _numpy_combine(rows, weights, combiner):
  """rows [B, N, D], weights [B, N] -> [B, D] (TPU combiner definitions)."""
  total = (rows * weights[..., None]).sum(1)
  if combiner == "sum":
    return total
  if combiner == "mean":
    return total / weights.sum(1, keepdims=True)
  return total / np.sqrt((weights**2).sum(1, keepdims=True))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize(
  "kind", ["dense1d", "ragged", "sparse", "ragged_weighted", "sparse_weighted"]
)
def test_lookup_equals_tf_serving_lookup(combiner, kind):
  rng = np.random.default_rng(3)
  table = _table(combiner)
  config = {"f": E.FeatureConfig(table)}
  ids = _ragged(rng)
  weights = tf.ragged.map_flat_values(
    lambda v: tf.random.stateless_uniform(tf.shape(v), [1, 2], 0.5, 2.0), ids
  )
  if kind == "dense1d":
    ids, weights = tf.constant(rng.integers(0, 23, size=B)), None
  elif kind == "ragged":
    weights = None
  elif kind == "sparse":
    ids, weights = ids.to_sparse(), None
  elif kind == "sparse_weighted":
    ids, weights = ids.to_sparse(), weights.to_sparse()
  emb = ServingEmbedding(config)
  emb.build()
  got = emb.lookup({"f": ids}, None if weights is None else {"f": weights})["f"]
  tables = {t: v for t, v in emb.embedding_tables.items()}
  want = E.serving_embedding_lookup(
    {"f": ids}, None if weights is None else {"f": weights}, tables, config
  )["f"]
  assert got.shape == (B, 7)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("width", [1, 3])
def test_dense_bags_are_combined(combiner, width):
  rng = np.random.default_rng(4)
  table = _table(combiner)
  config = {"f": E.FeatureConfig(table)}
  ids = tf.constant(rng.integers(0, 23, size=(B, width)))
  emb = ServingEmbedding(config)
  emb.build()
  got = emb.lookup({"f": ids})["f"]
  # TF keeps the bag axis: [B, N, D]; the convention combines it.
  tf_rows = E.serving_embedding_lookup(
    {"f": ids}, None, emb.embedding_tables, config
  )["f"].numpy()
  assert tf_rows.shape == (B, width, 7)
  want = _numpy_combine(tf_rows, np.ones((B, width), np.float32), combiner)
  assert got.shape == (B, 7)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["ragged", "sparse", "dense"])
def test_sequence_feature_is_padded_and_truncated(kind):
  table = _table("mean", vocab=11, dim=11, name="seq")
  config = {"s": E.FeatureConfig(table, max_sequence_length=3)}
  ids = tf.ragged.constant(
    [[1], [2, 3, 4, 5], [], [6, 7], [8, 9, 10]], dtype=tf.int64
  )
  if kind == "sparse":
    ids = ids.to_sparse()
  elif kind == "dense":
    ids = tf.constant([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], tf.int64)
  emb = ServingEmbedding(config)
  emb.build()
  got = emb.lookup({"s": ids})["s"].numpy()
  table_np = emb.embedding_tables[table].numpy()
  dense_ids = (
    ids
    if kind == "dense"
    else tf.RaggedTensor.from_sparse(ids)
    if kind == "sparse"
    else ids
  )
  want = np.zeros((B, 3, 11), np.float32)
  for b, row in enumerate(
    dense_ids.numpy() if kind == "dense" else dense_ids.to_list()
  ):
    for p, i in enumerate(list(row)[:3]):
      want[b, p] = table_np[i]
  assert got.shape == (B, 3, 11)
  np.testing.assert_array_equal(got, want)


def test_partial_weights_dict_and_shared_table():
  table = _table("mean")
  config = {"a": E.FeatureConfig(table), "b": E.FeatureConfig(table)}
  ids = tf.ragged.constant(
    [[1, 2], [3], [4, 5, 6], [7], [8, 9]], dtype=tf.int64
  )
  w = tf.ragged.constant(
    [[1.0, 3.0], [2.0], [1.0, 1.0, 2.0], [5.0], [1.0, 1.0]]
  )
  emb = ServingEmbedding(config)
  emb.build()
  got = emb.lookup({"a": ids, "b": ids}, {"a": w})
  want = E.serving_embedding_lookup(
    {"a": ids, "b": ids}, {"a": w, "b": None}, emb.embedding_tables, config
  )
  for k in ("a", "b"):
    np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-6)
  assert len(emb.embedding_tables) == 1


def test_refuses_training_weights_on_dense_and_tpu():
  config = {"f": E.FeatureConfig(_table("sum"))}
  emb = ServingEmbedding(config)
  emb.build()
  with pytest.raises(NotImplementedError, match="lookup-only"):
    emb.lookup({"f": tf.constant([1, 2])}, training=True)
  with pytest.raises(ValueError, match="feature 'f'.*dense"):
    emb.lookup({"f": tf.constant([1, 2])}, {"f": tf.constant([1.0, 2.0])})
  with pytest.raises(NotImplementedError):
    emb.apply_gradients({"f": tf.zeros([2, 7])})
  kind = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.UNSUPPORTED
  fake_tpu = types.SimpleNamespace(
    extended=types.SimpleNamespace(
      tpu_hardware_feature=types.SimpleNamespace(embedding_feature=kind)
    )
  )
  with pytest.raises(base.BackendUnavailableError, match="CPU/GPU only"):
    ServingEmbedding(config, strategy=fake_tpu)


def test_does_not_modify_the_users_configs():
  table = E.TableConfig(23, 7)  # no name, no optimizer
  ServingEmbedding({"f": E.FeatureConfig(table)}, E.Adagrad(0.1)).build()
  assert table.name is None and table.optimizer is None


def _trained_tensorcore():
  """A tensorcore backend after one Adagrad step: mixed features, shared
  table."""
  rng = np.random.default_rng(6)
  shared = _table("mean", name="shared")
  config = {
    "bag": E.FeatureConfig(shared),
    "one": E.FeatureConfig(shared),
    "dense_bag": E.FeatureConfig(_table("sqrtn", vocab=11, dim=11, name="d")),
    "seq": E.FeatureConfig(
      _table("sum", vocab=13, dim=5, name="s"), max_sequence_length=3
    ),
  }
  emb = backends.create(config, E.Adagrad(0.5), backend="tensorcore")
  emb.build()
  features = {
    "bag": _ragged(rng),
    "one": tf.constant(rng.integers(0, 23, size=B)),
    "dense_bag": tf.constant(rng.integers(0, 11, size=(B, 3))),
    "seq": _ragged(rng, vocab=13),
  }
  bag = features["bag"]
  weights = {
    "bag": bag.with_flat_values(
      tf.constant(rng.uniform(0.5, 2.0, size=bag.values.shape[0]), tf.float32)
    ),
    "one": None,
    "dense_bag": None,
    "seq": None,
  }
  acts = emb.lookup(features, weights, training=True)
  emb.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))
  return emb, features, weights


def test_serving_lookup_on_a_training_backends_tables_in_place():
  """Any subset of features, on tensorcore's own variables: tensorcore's
  lookups."""
  emb, features, weights = _trained_tensorcore()
  want = emb.lookup(features, weights)
  got = serving_lookup(
    features, weights, emb.embedding_tables, emb.feature_config
  )
  subset = serving_lookup(
    {"dense_bag": features["dense_bag"]},
    None,
    emb.embedding_tables,
    emb.feature_config,
  )
  assert sorted(subset) == ["dense_bag"] and subset["dense_bag"].shape == (
    B,
    11,
  )
  assert got["seq"].shape == (B, 3, 5)
  for name in want:
    np.testing.assert_allclose(
      got[name].numpy(), want[name].numpy(), rtol=1e-6, atol=1e-7, err_msg=name
    )
  np.testing.assert_allclose(
    subset["dense_bag"].numpy(), want["dense_bag"].numpy(), rtol=1e-6, atol=1e-7
  )
  with pytest.raises(ValueError, match=r"\['nope'\] are not in feature_config"):
    serving_lookup(
      {"nope": features["one"]}, None, emb.embedding_tables, emb.feature_config
    )


def test_from_backend_copies_the_tables_without_slots():
  emb, features, weights = _trained_tensorcore()
  copy = ServingEmbedding.from_backend(emb)
  assert sorted(copy.slot_variables()["shared"]) == []
  assert [copy.table_name(t) for t in copy.tables] == [
    emb.table_name(t) for t in emb.tables
  ]
  served = copy.lookup(features, {"bag": weights["bag"]})  # missing: unweighted
  want = emb.lookup(features, weights)
  for name in want:
    np.testing.assert_allclose(
      served[name].numpy(),
      want[name].numpy(),
      rtol=1e-6,
      atol=1e-7,
      err_msg=name,
    )


def test_a_restore_only_backend_holds_zeros_and_no_slots_until_restored(
  tmp_path,
):
  """What `recsys export` restores into: the tables alone (no slots under
  a sloted optimizer), zeros (nothing drawn), then the checkpoint's rows;
  `from_backend` serves it as it is instead of copying it."""
  emb, features, weights = _trained_tensorcore()
  path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "c"))
  config, _ = mid_level.tf_feature_config(emb)
  restored = ServingEmbedding(config, E.Adagrad(0.1), restore_only=True)
  restored.build()
  assert all(not slots for slots in restored.slot_variables().values())
  for variable in restored.embedding_tables.values():
    assert not np.any(variable.numpy())
  ckpt.restore(restored, path)
  assert ServingEmbedding.from_backend(restored) is restored
  trained = {emb.table_name(t): v for t, v in emb.embedding_tables.items()}
  for table, variable in restored.embedding_tables.items():
    np.testing.assert_array_equal(
      variable.numpy(), tf.convert_to_tensor(trained[table.name]).numpy()
    )
  served = restored.lookup(features, weights)
  want = emb.lookup(features, weights)
  for name in want:
    np.testing.assert_allclose(
      served[name].numpy(), want[name].numpy(), rtol=1e-6, atol=1e-7
    )


# -- export --------------------------------------------------------------------


class _TinyRanker(tf.keras.Model):
  """scores = sigmoid(w . [acts, dense]); the model contract of
  recsys/models."""

  def __init__(self):
    super().__init__()
    self.dense = tf.keras.layers.Dense(
      1, kernel_initializer=tf.keras.initializers.RandomNormal(seed=3)
    )

  def call(self, activations, features=None):
    x = tf.concat(
      [activations["user"], activations["tags"], features["dense"]], 1
    )
    return tf.squeeze(tf.sigmoid(self.dense(x)), -1)


def _feature_config():
  users = E.TableConfig(23, 7, name="users", combiner="sum")
  tags = E.TableConfig(11, 11, name="tags", combiner="mean")
  return {"user": E.FeatureConfig(users), "tags": E.FeatureConfig(tags)}


def _batch(seed):
  rng = np.random.default_rng(seed)
  return {
    "dense": tf.constant(rng.normal(size=(B, 3)).astype(np.float32)),
    "categorical": {
      "user": tf.constant(rng.integers(0, 23, size=B)),
      "tags": _ragged(rng, vocab=11),
    },
  }


def _split(features):
  return features["categorical"], features.get("weights")


@pytest.mark.slow
def test_export_serves_the_trained_scores_in_a_fresh_process(tmp_path):
  emb = backends.create(_feature_config(), E.Adagrad(0.3), backend="tensorcore")
  emb.build()
  model = _TinyRanker()
  keras_opt = tf.keras.optimizers.SGD(0.1)
  for step in range(3):
    batch = _batch(step)
    with tf.GradientTape(persistent=True) as tape:
      acts = emb.lookup(batch["categorical"], training=True)
      tape.watch(acts)
      loss = tf.reduce_mean((model(acts, batch) - 1.0) ** 2)
    emb.apply_gradients(tape.gradient(loss, acts))
    keras_opt.apply_gradients(
      zip(
        tape.gradient(loss, model.trainable_variables),
        model.trainable_variables,
      )
    )
  probe = _batch(99)
  trained_scores = model(emb.lookup(probe["categorical"]), probe).numpy()
  path = tf.train.Checkpoint(embedding=emb, model=model).save(
    str(tmp_path / "ckpt" / "ckpt")
  )

  # Serving side: a fresh model and a slot-free serving embedding.
  serving_emb = ServingEmbedding(_feature_config())
  ckpt.restore(serving_emb, path)
  serving_model = _TinyRanker()
  tf.train.Checkpoint(model=serving_model).restore(path).expect_partial()
  signature = {
    "dense": tf.TensorSpec([None, 3], tf.float32),
    "categorical": {
      "user": tf.TensorSpec([None], tf.int64),
      "tags": tf.RaggedTensorSpec([None, None], tf.int64),
    },
  }
  export_dir = export_saved_model(
    str(tmp_path / "export"),
    serving_emb,
    serving_model,
    signature,
    split_fn=_split,
  )

  cat = probe["categorical"]
  inputs = {
    "dense": probe["dense"].numpy().tolist(),
    "user": cat["user"].numpy().tolist(),
    "tags": cat["tags"].to_list(),
  }
  script = textwrap.dedent(f"""
      import json, sys
      import tensorflow as tf
      inputs = json.loads(sys.stdin.read())
      loaded = tf.saved_model.load({export_dir!r})
      features = {{"dense": tf.constant(inputs["dense"], tf.float32),
                   "categorical": {{
                       "user": tf.constant(inputs["user"], tf.int64),
                       "tags": tf.ragged.constant(inputs["tags"], tf.int64)}}}}
      print(json.dumps(loaded.serve(features).numpy().tolist()))
      """)
  result = subprocess.run(
    [sys.executable, "-c", script],
    input=json.dumps(inputs),
    capture_output=True,
    text=True,
    check=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
  )
  served = np.array(
    json.loads(result.stdout.strip().splitlines()[-1]), np.float32
  )
  np.testing.assert_allclose(served, trained_scores, rtol=1e-6, atol=1e-7)


class _Scaled(tf.Module):
  def __init__(self):
    super().__init__()
    self.scale = tf.Variable(2.0)

  def __call__(self, activations, features):
    del features
    return self.scale * tf.reduce_sum(activations["user"], 1)


def test_export_with_dense_inputs_has_a_serving_signature(tmp_path):
  config = {"user": E.FeatureConfig(_table("sum", name="users"))}
  emb = ServingEmbedding(config)
  emb.build()
  signature = {"user": tf.TensorSpec([None], tf.int64)}
  export_dir = export_saved_model(
    str(tmp_path / "export"), emb, _Scaled(), signature
  )
  loaded = tf.saved_model.load(export_dir)
  ids = tf.constant([1, 4, 22], tf.int64)
  want = 2.0 * emb.embedding_tables[config["user"].table].numpy()[
    [1, 4, 22]
  ].sum(1)
  got = loaded.signatures["serving_default"](user=ids)["scores"].numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6)
