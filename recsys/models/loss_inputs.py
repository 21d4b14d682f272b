"""`LossInputs`: what a model's loss reads of one batch, as one record.

Every model's loss takes this one argument (`per_example_loss(batch)`,
`compute_loss(inputs)`), so a model overrides one narrow method and a caller
(the training step, evaluation, the batch slices, `fit`) names what it
passes once, by field, instead of repeating six arguments in each.

It is a nest to TensorFlow (`__tf_flatten__`), so it passes through
`tf.function` and `strategy.run` as a tuple of tensors would.

Example:
  >>> batch = LossInputs(acts, features, labels, training=False)
  >>> model.per_example_loss(batch)  # [B]
  >>> model.compute_loss(batch)  # this replica's scalar share
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LossInputs:
  """One batch as a model's loss reads it.

  Attributes:
    activations: feature name -> `[B, D]` / `[B, L, D]` from the backend.
    features: the batch's features (`features["dense"]` `[B, num_dense]`,
      a retrieval batch's candidate ids, ...); None: no dense features.
    labels: `[B]` 0/1 labels or ratings (a retrieval model ignores them).
    sample_weight: optional `[B]` example weights; a row weighted 0 (a
      padded eval batch's padding) counts for nothing: neither its loss,
      nor the metrics, nor as a retrieval negative.
    training: the Keras training flag, passed to the layers.
    compute_metrics: update `model.metrics` too; None: the model's default
      (a ranking model: yes; a retrieval model: when not training).
  """

  activations: Mapping[str, tf.Tensor]
  features: Mapping[str, Any] | None = None
  labels: tf.Tensor | None = None
  _: dataclasses.KW_ONLY
  sample_weight: tf.Tensor | None = None
  training: bool = True
  compute_metrics: bool | None = None

  @tf.autograph.experimental.do_not_convert
  def replace(self, **changes: Any) -> "LossInputs":
    """A copy with `changes` (field name -> value)."""
    return dataclasses.replace(self, **changes)

  # TF's nest protocol: `tf.function`, `strategy.run` and `tf.nest` see the
  # tensors, the flags are part of the structure (a traced Python value).
  def __tf_flatten__(self) -> tuple[tuple, tuple]:
    metadata = (self.training, self.compute_metrics)
    components = (self.activations, self.features, self.labels)
    return metadata, components + (self.sample_weight,)

  @classmethod
  def __tf_unflatten__(cls, metadata: tuple, components: tuple) -> "LossInputs":
    training, compute_metrics = metadata
    activations, features, labels, sample_weight = components
    return cls(
      activations,
      features,
      labels,
      sample_weight=sample_weight,
      training=training,
      compute_metrics=compute_metrics,
    )
