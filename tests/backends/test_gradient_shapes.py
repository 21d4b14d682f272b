"""Activation gradients of the wrong shape are refused, naming the feature.

Before this check, `apply_gradients` reshaped whatever it got: an extra row
was ignored, a `[D, B]` gradient was read as `[B, D]`. Every backend now runs
`backends.base.check_activation_gradients` against the activations of its
training lookup.
"""

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base  # noqa: E402
from backends.mid_level.tpu_embedding import TPUEmbeddingBackend  # noqa: E402
from backends.mid_level.tpu_embedding_v0 import TPUEmbeddingV0Backend  # noqa: E402
from backends.tensorcore.backend import TensorCoreEmbedding  # noqa: E402
from tests.backends.test_selection import fake_tpu_strategy  # noqa: E402

E = tf.tpu.experimental.embedding


def _config():
  table = E.TableConfig(
    23, 4, name="t", initializer=tf.keras.initializers.Constant(0.5)
  )
  return {
    "f": E.FeatureConfig(table),
    "s": E.FeatureConfig(table, max_sequence_length=3),
  }


def _features():
  return {
    "f": tf.constant([3, 5], tf.int64),
    "s": tf.ragged.constant([[1, 2], [7]], dtype=tf.int64),
  }


def _good_grads():
  return {"f": tf.ones([2, 4]), "s": tf.ones([2, 3, 4])}


BAD = [
  ("f", [3, 4], "an extra row"),
  ("f", [1, 4], "a row too few"),
  ("f", [4, 2], "[D, B] for [B, D]"),
  ("f", [2, 5], "a wrong dim"),
  ("f", [2, 4, 1], "a wrong rank"),
  ("s", [2, 4, 3], "a transposed sequence"),
  ("s", [2, 12], "a flattened sequence"),
]


@pytest.mark.parametrize(
  "static_shapes", [False, True], ids=["generic", "static"]
)
@pytest.mark.parametrize("feature,shape,why", BAD, ids=[b[2] for b in BAD])
def test_tensorcore_refuses_wrong_shapes_and_leaves_the_table(
  static_shapes, feature, shape, why
):
  del why
  emb = TensorCoreEmbedding(_config(), E.SGD(0.1), static_shapes=static_shapes)
  emb.lookup(_features(), training=True)
  before = emb.embedding_tables[emb.tables[0]].numpy()
  grads = _good_grads()
  grads[feature] = tf.ones(shape)
  with pytest.raises(base.GradientShapeError) as e:
    emb.apply_gradients(grads)
  message = str(e.value)
  assert repr(feature) in message and str(shape) in message
  expected = [2, 4] if feature == "f" else [2, 3, 4]
  assert str(expected) in message
  np.testing.assert_array_equal(
    emb.embedding_tables[emb.tables[0]].numpy(), before
  )


def test_tensorcore_right_shapes_still_train():
  emb = TensorCoreEmbedding(_config(), E.SGD(0.1))
  emb.lookup(_features(), training=True)
  emb.apply_gradients(_good_grads())
  table = emb.embedding_tables[emb.tables[0]].numpy()
  # SGD(0.1), gradient 1 per use: rows 3 and 5 once, 1, 2, 7 once each.
  for row in (1, 2, 3, 5, 7):
    np.testing.assert_allclose(table[row], 0.4, rtol=1e-6)
  np.testing.assert_allclose(table[0], 0.5)


def test_a_dynamic_batch_is_checked_when_the_step_runs():
  emb = TensorCoreEmbedding({"f": _config()["f"]}, E.SGD(0.1))
  emb.build()

  @tf.function(
    input_signature=[
      tf.TensorSpec([None], tf.int64),
      tf.TensorSpec([None, 4], tf.float32),
    ]
  )
  def step(ids, grad):
    emb.lookup({"f": ids}, training=True)
    emb.apply_gradients({"f": grad})
    return tf.constant(0)

  step(tf.constant([3, 5], tf.int64), tf.ones([2, 4]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="feature `f`"):
    step(tf.constant([3, 5], tf.int64), tf.ones([3, 4]))


def test_check_is_static_where_shapes_are_known():
  act = tf.TensorShape([None, 4])
  with pytest.raises(base.GradientShapeError, match="feature 'x'"):
    base.check_activation_gradients(["x"], [tf.ones([2, 5])], [act])
  (got,) = base.check_activation_gradients(["x"], [tf.ones([2, 4])], [act])
  assert got.shape == [2, 4]
  assert base.check_activation_gradients(["x"], [None], [act]) == [None]


class _FakeEngine:
  """Stands in for TF's TPUEmbedding (no TPU here): fixed activations."""

  def __init__(self):
    self.applied = []

  def build(self, **unused):
    pass

  def enqueue(self, features, weights, training):
    del features, weights, training

  def dequeue(self):
    return {"f": tf.zeros([2, 4]), "s": tf.zeros([2, 3, 4])}

  def apply_gradients(self, grads, **unused):
    self.applied.append(grads)


class _EngineBackend(TPUEmbeddingBackend):
  def _create_mid_level(self):
    return _FakeEngine()


def test_tpu_embedding_refuses_wrong_shapes_before_the_engine_sees_them():
  strategy = fake_tpu_strategy("V1")
  strategy.scope = tf.distribute.get_strategy().scope  # the fake engine's
  emb = _EngineBackend(_config(), E.SGD(0.1), strategy=strategy)
  emb.build()
  emb.lookup(_features(), training=True)
  grads = _good_grads()
  grads["f"] = tf.ones([4, 2])
  with pytest.raises(base.GradientShapeError, match="'f'.*\\[4, 2\\]"):
    emb.apply_gradients(grads)
  assert emb.mid_level.applied == []
  emb.lookup(_features(), training=True)
  emb.apply_gradients(_good_grads())
  assert len(emb.mid_level.applied) == 1


class _FakeV0:
  """Stands in for TF's TPUEmbeddingV0 (it needs a TPUStrategy): a gather."""

  def __init__(self):
    self._variables = {"t": {"parameters": tf.Variable(tf.fill([23, 4], 0.5))}}

  def build(self):
    pass

  def embedding_lookup(self, features, weights):
    del weights
    table = self._variables["t"]["parameters"]
    return {
      "f": tf.gather(table, features["f"]),
      "s": tf.gather(table, features["s"].to_tensor(shape=[2, 3])),
    }


class _V0Backend(TPUEmbeddingV0Backend):
  def _create_mid_level(self):
    return _FakeV0()


def test_tpu_embedding_v0_refuses_wrong_shapes():
  strategy = fake_tpu_strategy("UNSUPPORTED")
  strategy.scope = tf.distribute.get_strategy().scope
  emb = _V0Backend(_config(), E.SGD(0.1), strategy=strategy)
  emb.lookup(_features(), training=True)
  grads = _good_grads()
  grads["s"] = tf.ones([2, 4, 3])
  with pytest.raises(base.GradientShapeError, match="'s'.*\\[2, 4, 3\\]"):
    emb.apply_gradients(grads)
  table = emb.embedding_tables[emb.tables[0]]
  np.testing.assert_array_equal(table.numpy(), 0.5)
