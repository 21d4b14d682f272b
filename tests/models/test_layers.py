"""Tests of recsys.models.layers: MLPs, sequence pooling, activation and dense checks."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.models import layers
from recsys.models.errors import FeatureMismatchError, ModelConfigError
from tests.models import reference


def test_mlp_matches_numpy():
  stack = layers.mlp((11, 7), final_activation=None, name="t")
  x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  out = stack(x).numpy()
  assert out.shape == (5, 7)
  np.testing.assert_allclose(
    out,
    reference.dense_stack(x, stack.layers, final_linear=True),
    rtol=1e-5,
    atol=1e-5,
  )


@pytest.mark.parametrize("sizes", [(0,), (7, -1), (2.5,)])
def test_mlp_rejects_bad_sizes(sizes):
  with pytest.raises(ModelConfigError, match="positive integers"):
    layers.mlp(sizes, name="bad")


def test_pool_sequence_mean_ignores_padding():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(5, 4, 7)).astype(np.float32)
  lengths = np.array([4, 1, 2, 0, 3])
  for b, n in enumerate(lengths):
    x[b, n:] = 0.0
  pooled = layers.pool_sequence(tf.constant(x), "mean").numpy()
  expected = np.stack(
    [x[b, :n].mean(0) if n else np.zeros(7) for b, n in enumerate(lengths)]
  )
  np.testing.assert_allclose(pooled, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    layers.pool_sequence(tf.constant(x), "sum").numpy(),
    x.sum(1),
    rtol=1e-6,
    atol=1e-6,
  )


def test_check_names_reports_missing_and_unexpected():
  acts = {"a": tf.zeros([5, 7]), "z": tf.zeros([5, 7])}
  with pytest.raises(
    FeatureMismatchError, match=r"Missing: \['b'\]; unexpected: \['z'\]"
  ):
    layers.check_names(acts, ["a", "b"], "M")
  layers.check_names(acts, ["a"], "M", allow_extra=True)


def test_flat_activations_rank_errors():
  acts = {"s": tf.zeros([5, 4, 7]), "bad": tf.zeros([5])}
  with pytest.raises(
    FeatureMismatchError, match="'s'.*sequence_pooling='reject'"
  ):
    layers.flat_activations(acts, ["s"], sequence_pooling="reject", owner="M")
  with pytest.raises(FeatureMismatchError, match="'bad'.*expected \\[B, D\\]"):
    layers.flat_activations(acts, ["bad"], sequence_pooling="mean", owner="M")
  with pytest.raises(ModelConfigError, match="mean, sum, reject"):
    layers.check_pooling("max", "M")


def test_dense_input_errors():
  assert layers.dense_input({}, 0, "M") is None
  with pytest.raises(
    FeatureMismatchError, match="num_dense=3 but the batch has no"
  ):
    layers.dense_input({"categorical": {}}, 3, "M")
  with pytest.raises(FeatureMismatchError, match=r"expected \[B, 3\]"):
    layers.dense_input({"dense": tf.zeros([5, 4])}, 3, "M")


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("num_vectors", [2, 3, 9])
def test_dot_interaction_matches_numpy_and_tfrs(self_interaction, num_vectors):
  import tensorflow_recommenders as tfrs

  rng = np.random.default_rng(num_vectors)
  vectors = [
    tf.constant(rng.normal(size=(5, 7)).astype(np.float32))
    for _ in range(num_vectors)
  ]
  ours = layers.DotInteraction(self_interaction=self_interaction)
  theirs = tfrs.layers.feature_interaction.DotInteraction(
    self_interaction=self_interaction
  )
  upstream = tf.constant(
    rng.normal(
      size=reference.dot_interaction(
        [v.numpy() for v in vectors], self_interaction
      ).shape
    ).astype(np.float32)
  )

  def value_and_grads(layer):
    with tf.GradientTape() as tape:
      tape.watch(vectors)
      out = layer(vectors)
      loss = tf.reduce_sum(out * upstream)
    return out.numpy(), [g.numpy() for g in tape.gradient(loss, vectors)]

  out, grads = value_and_grads(ours)
  tfrs_out, tfrs_grads = value_and_grads(theirs)
  np.testing.assert_allclose(
    out,
    reference.dot_interaction([v.numpy() for v in vectors], self_interaction),
    rtol=1e-5,
    atol=1e-5,
  )
  # Exact: TFRS's Gram matmul on the same shapes, then each output is one
  # product times 1 plus exact zeros.
  np.testing.assert_array_equal(out, tfrs_out)
  for g, tg in zip(grads, tfrs_grads):
    np.testing.assert_allclose(g, tg, rtol=1e-5, atol=1e-6)


def test_dot_interaction_rejects_unequal_widths():
  with pytest.raises(FeatureMismatchError, match="one width"):
    layers.DotInteraction()([tf.zeros([5, 7]), tf.zeros([5, 11])])
