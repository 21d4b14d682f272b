"""`LossInputs`: one record for a loss, a nest to TensorFlow, and
`compute_loss(inputs, training)` as TFRS calls it."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.feature_spec import FeatureSpec
from recsys.models import DLRM, LossInputs
from recsys.models.base import replica_loss

SPECS = [FeatureSpec("user", 23), FeatureSpec("item", 29)]


def _batch(rows=5):
  rng = np.random.default_rng(0)
  acts = {
    name: tf.constant(rng.normal(size=(rows, 7)), tf.float32)
    for name in ("user", "item")
  }
  features = {"dense": tf.constant(rng.normal(size=(rows, 3)), tf.float32)}
  labels = tf.constant(rng.integers(0, 2, rows), tf.float32)
  return LossInputs(acts, features, labels)


def test_the_flags_are_keywords_and_replace_copies():
  batch = _batch()
  assert batch.training is True and batch.compute_metrics is None
  with pytest.raises(TypeError):
    LossInputs({}, None, None, None)  # sample_weight only by name
  evaluation = batch.replace(training=False)
  assert evaluation.training is False and batch.training is True
  assert evaluation.activations is batch.activations


def test_it_is_a_nest_whose_flags_are_structure():
  batch = _batch().replace(compute_metrics=False)
  flat = tf.nest.flatten(batch)
  assert len(flat) == 2 + 1 + 1 + 1  # two activations, dense, labels, None
  again = tf.nest.pack_sequence_as(batch, flat)
  assert isinstance(again, LossInputs) and again.compute_metrics is False
  doubled = tf.nest.map_structure(lambda x: None if x is None else 2 * x, batch)
  np.testing.assert_allclose(doubled.labels, 2 * batch.labels)


def test_compute_loss_is_the_replica_share_and_training_overrides():
  model = DLRM(SPECS, num_dense=3, bottom_mlp=(7,), top_mlp=(9,))
  model.create_variables({"user": 7, "item": 7})
  batch = _batch().replace(compute_metrics=False)
  want = replica_loss(model, model.per_example_loss(batch), None)
  np.testing.assert_allclose(model.compute_loss(batch), want, rtol=1e-6)
  # TFRS's train_step passes `training`: it replaces the record's flag.
  in_eval = model.compute_loss(batch, training=False)
  np.testing.assert_allclose(
    in_eval, model.compute_loss(batch.replace(training=False)), rtol=1e-6
  )
  traced = tf.function(model.compute_loss)(batch, training=False)
  np.testing.assert_allclose(traced, in_eval, rtol=1e-6)
