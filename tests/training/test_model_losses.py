"""A model's own losses (regularizers, `add_loss`) in the Trainer's steps.

Weight regularizers are constant over a batch; an activity regularizer or
`add_loss` is a loss of the batch's call, which exists only inside the step
that made it: evaluation read it eagerly afterwards and crashed with a raw
TypeError (issue 55). Now each eval step adds its `model.losses` to a mean,
reported as `eval/regularization_loss` and added into `eval/loss`.
"""

import functools

import numpy as np
import tensorflow as tf

from recsys import planning
from recsys._keras import keras
from recsys.models import DLRM
from tests.training import test_trainer


class _Penalty(keras.layers.Layer):
  def call(self, x):
    self.add_loss(0.01 * tf.reduce_mean(tf.square(x)))
    return x


class _PenalizedDLRM(DLRM):
  """A DLRM whose logits pay an `add_loss` penalty and whose first top-MLP
  layer an activity regularizer."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.top_mlp.layers[0].activity_regularizer = keras.regularizers.L2(0.01)
    self.penalty = _Penalty()

  def logits(self, activations, features=None, training=False):
    return self.penalty(super().logits(activations, features, training))


def _train(tmp_path, model, monkeypatch):
  monkeypatch.setattr(test_trainer, "MODEL", model)
  trainer = test_trainer.make_trainer(tmp_path, train_steps=4)
  return trainer, trainer.train()


def test_add_loss_and_activity_regularizers_train_and_evaluate(
  tmp_path, monkeypatch
):
  model = functools.partial(_PenalizedDLRM, bottom_mlp=(11, 7), top_mlp=(11,))
  _, metrics = _train(tmp_path, model, monkeypatch)
  assert metrics["eval/regularization_loss"] > 0
  np.testing.assert_allclose(
    metrics["eval/loss"],
    metrics["eval/logloss"] + metrics["eval/regularization_loss"],
    rtol=1e-6,
  )


def test_weight_regularization_is_the_numpy_sum_of_the_kernels(
  tmp_path, monkeypatch
):
  l2 = 0.003
  model = functools.partial(
    DLRM, bottom_mlp=(11, 7), top_mlp=(11,), l2_regularization=l2
  )
  trainer, metrics = _train(tmp_path, model, monkeypatch)
  kernels = [
    v.numpy() for v in trainer.model.trainable_variables if "kernel" in v.name
  ]
  want = l2 * sum(
    float(np.sum(np.square(k, dtype=np.float64))) for k in kernels
  )
  np.testing.assert_allclose(
    metrics["eval/regularization_loss"], want, rtol=1e-5
  )


def test_a_float16_table_reports_the_values_it_saturated(tmp_path):
  """An update past float16's range saturates, and the Trainer says how
  many values did (train/saturated_values/<table>: TensorBoard, metrics)."""
  trainer = test_trainer.make_trainer(
    tmp_path,
    train_steps=4,
    optimizer=tf.tpu.experimental.embedding.SGD(1e7),
    placement=planning.EmbeddingPlacement(table_dtype="float16"),
    nonfinite_policy="skip",
  )
  metrics = trainer.train()
  counts = {k: v for k, v in metrics.items() if "saturated_values" in k}
  assert counts and max(counts.values()) > 0, metrics
  tables = [
    tf.convert_to_tensor(t) for t in trainer.backend.embedding_tables.values()
  ]
  assert all(np.isfinite(t.numpy()).all() for t in tables)
  assert max(float(np.abs(t.numpy()).max()) for t in tables) == 65504.0
