"""What every model shares (loss convention, specs) and ranking models.

Retrieval models (`recsys.models.retrieval`) build on `_ModelBase` too.

A model receives the embedding backend's activations (dict feature name ->
`[B, D]` or `[B, L, D]`) and the raw batch `features`; it never creates
embedding tables nor touches `tf.tpu` or a distribution strategy.

A model's loss takes what a loss needs as one record: `per_example_loss(
LossInputs(activations, features, labels, sample_weight=..., training=...))`
gives each example's weighted loss `[B]` (a row weighted 0, e.g. a padded
eval row, counts for nothing: neither its loss, nor the metrics, nor as a
retrieval negative); it is the one method a model's loss overrides. The loop
turns it into the replica's share of the step's loss (`replica_loss`), the
convention TF's custom training loops use:

  per-replica loss = sum_i w_i * loss_i / global_batch_size
                     + sum(model.losses) / num_replicas_in_sync

so that summing the per-replica losses (which is what the gradient all-reduce
does) gives the mean loss over the global batch plus the regularization loss
once. When `global_batch_size` is None it is the local batch size times the
number of replicas in sync (`tf.nn.compute_average_loss`); the regularization
term is scaled by `tf.nn.scale_regularization_loss`. With the default
strategy both divisors are the plain batch size and 1. `compute_loss(inputs,
training)` (Keras's `fit`, a TFRS-style loop) is that share with the global
batch unknown, implemented once here.

Metrics are Keras metrics (a ranking model's TFRS task's; a retrieval
model's corpus hit rates); the loss updates them (also inside
`strategy.run` with several replicas) and `model.metrics` lists them so a
trainer can reset and read them.
"""

import abc
from collections.abc import Mapping, Sequence
from typing import Annotated

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys import ranges
from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import evaluation_hooks as hooks_lib
from recsys.models import layers as model_layers
from recsys.models.errors import FeatureMismatchError, ModelConfigError
from recsys.models.loss_inputs import LossInputs

OBJECTIVES = ("binary", "mse")
#: A ranking model's `objective` parameter, declared (`recsys.ranges`).
Objective = Annotated[str, ranges.Choice(OBJECTIVES)]
#: The thresholds of a ranking model's AUC metric (Keras takes > 1).
AucThresholds = Annotated[int, ranges.Int(2)]


def _check_specs(feature_specs: Sequence[FeatureSpec], owner: str) -> tuple:
  specs = tuple(feature_specs)
  if not specs:
    raise ModelConfigError(
      f"{owner}: feature_specs is empty; a model needs at "
      "least one categorical feature."
    )
  names = [s.name for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ModelConfigError(
      f"{owner}: duplicate feature names {duplicates} in feature_specs."
    )
  return specs


@tf.autograph.experimental.do_not_convert
def average_loss(
  per_example: tf.Tensor, global_batch_size: int | None
) -> tf.Tensor:
  """The replica's share of the global mean of `per_example` (summed over
  replicas by the step), or TF's average when the global batch is unknown."""
  if global_batch_size is None:
    return tf.nn.compute_average_loss(per_example)
  return tf.reduce_sum(per_example) / tf.cast(
    global_batch_size, per_example.dtype
  )


@tf.autograph.experimental.do_not_convert
def regularization_loss(model: keras.Model) -> tf.Tensor:
  """The replica's share of `model.losses` (0.0 without any)."""
  if not model.losses:
    return tf.constant(0.0)
  return tf.nn.scale_regularization_loss(tf.add_n(model.losses))


@tf.autograph.experimental.do_not_convert
def replica_loss(
  model: keras.Model,
  per_example: tf.Tensor,
  global_batch_size: int | None,
  include_regularization: bool = True,
) -> tf.Tensor:
  """The replica's share of the step's loss (the module docstring's
  convention) from its examples' weighted losses `per_example` `[B]`; a
  model whose `SUMMED_LOSS` is true gets their plain sum instead."""
  if getattr(model, "SUMMED_LOSS", False):
    loss = tf.reduce_sum(per_example)
  else:
    loss = average_loss(per_example, global_batch_size)
  if include_regularization:
    loss += regularization_loss(model)
  return loss


@tf.autograph.experimental.do_not_convert
def example_weights(
  sample_weight: tf.Tensor | None, dtype: tf.DType
) -> tf.Tensor | None:
  """The example weights as `[B]` of `dtype` (None: every example 1)."""
  if sample_weight is None:
    return None
  return tf.cast(tf.reshape(sample_weight, [-1]), dtype)


class _ModelBase(keras.Model):
  """What ranking and retrieval models share: specs, variables, regularizers."""

  #: True: the step minimizes the SUM of the per-example losses, never
  #: divided by a batch size (iALS, whose gradient must be exactly
  #: e_r - solve_r at each row; `recsys.models.retrieval.ials`).
  SUMMED_LOSS: bool = False
  #: True: each example's loss depends on that example alone, so the step
  #: may compute the dense part on slices of the batch side by side
  #: (`recsys.training.batch_slices`); not so for in-batch negatives.
  EXAMPLES_INDEPENDENT: bool = False

  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    num_dense: int,
    sequence_pooling: str,
    name: str | None,
  ) -> None:
    super().__init__(name=name)
    owner = type(self).__name__
    self._specs = _check_specs(feature_specs, owner)
    self._sequence_pooling = model_layers.check_pooling(sequence_pooling, owner)
    if (
      not isinstance(num_dense, int)
      or isinstance(num_dense, bool)
      or num_dense < 0
    ):
      raise ModelConfigError(
        f"{owner}: num_dense must be an integer >= 0, got {num_dense!r}."
      )
    self._num_dense = num_dense

  @property
  def num_dense(self) -> int:
    """Width of `features["dense"]` (0: the model uses no dense features)."""
    return self._num_dense

  @property
  def feature_specs(self) -> tuple:
    """The `FeatureSpec`s the model was built for, in model order."""
    return self._specs

  @property
  def feature_names(self) -> list:
    """Names of the categorical features, in model order."""
    return [s.name for s in self._specs]

  @tf.autograph.experimental.do_not_convert
  def _vectors(
    self,
    activations: Mapping[str, tf.Tensor],
    names: Sequence[str],
    allow_extra: bool = False,
  ) -> list:
    """The activations of `names` as `[B, D_f]` (sequences pooled), checked.

    Raises:
      FeatureMismatchError: a feature is missing (or, without `allow_extra`,
        unexpected), or an activation has the wrong rank.
    """
    owner = type(self).__name__
    model_layers.check_names(activations, names, owner, allow_extra=allow_extra)
    return model_layers.flat_activations(
      activations, names, sequence_pooling=self._sequence_pooling, owner=owner
    )

  @abc.abstractmethod
  def per_example_loss(self, batch: LossInputs) -> tf.Tensor:
    """Each example's weighted loss `[B]` (regularization left out), and
    the metric updates (see the module docstring): the one method a model's
    loss overrides."""

  def compute_loss(
    self, inputs: LossInputs, training: bool | None = None
  ) -> tf.Tensor:
    """The scalar loss as TFRS's `compute_loss(inputs, training)` gives it:
    this replica's share, the global batch unknown (`replica_loss`),
    regularization included. `training`, when given, replaces
    `inputs.training` (as a TFRS `train_step` passes it)."""
    if training is not None:
      inputs = inputs.replace(training=training)
    return replica_loss(self, self.per_example_loss(inputs), None)

  def create_variables(self, embedding_dims: Mapping[str, int]) -> "_ModelBase":
    """Creates every variable now, by calling the model on a dummy batch of one.

    Call it inside `strategy.scope()` before building the dense optimizer or
    restoring a checkpoint, so no variable is created inside a `tf.function`.

    Args:
      embedding_dims: feature name -> embedding dim of its table.

    Returns:
      self.

    Raises:
      FeatureMismatchError: a feature of the model has no dim.
    """
    missing = [n for n in self.feature_names if n not in embedding_dims]
    if missing:
      raise FeatureMismatchError(
        f"{type(self).__name__}.create_variables: no embedding dim for "
        f"features {missing}; got dims for {sorted(embedding_dims)}."
      )
    acts = {}
    for spec in self._specs:
      dim = int(embedding_dims[spec.name])
      shape = (
        [1, spec.sequence_length, dim] if spec.sequence_length else [1, dim]
      )
      acts[spec.name] = tf.zeros(shape)
    features = (
      {"dense": tf.zeros([1, self._num_dense])} if self._num_dense else {}
    )
    self(acts, features, training=False)
    return self

  def evaluation_hooks(
    self, context: hooks_lib.EvaluationContext
  ) -> hooks_lib.EvaluationHooks:
    """What a trainer does around this model's evaluation
    (`recsys.models.evaluation_hooks`): nothing more, for a ranking model."""
    del context
    return hooks_lib.EvaluationHooks()


class RankingModel(_ModelBase, metaclass=abc.ABCMeta):
  """A model that scores each example: click probability or rating.

  Subclasses implement `logits(activations, features, training) -> [B]`.
  With `objective="binary"` the task is binary cross-entropy on the logit
  (metrics: AUC, log-loss, accuracy) and `model(...)` returns probabilities;
  with `objective="mse"` the logit is the predicted rating (metric: RMSE).
  """

  EXAMPLES_INDEPENDENT = True
  #: What the Trainer passes a ranking model's constructor, from the source.
  TRAINER_ARGUMENTS: tuple[str, ...] = ("feature_specs", "num_dense")

  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    num_dense: int = 0,
    objective: str = "binary",
    sequence_pooling: str = "mean",
    auc_num_thresholds: int = 1000,
    name: str | None = None,
  ) -> None:
    """Initializes the task and metrics.

    Args:
      feature_specs: the data source's categorical features.
      num_dense: width of `features["dense"]` (0: no dense features).
      objective: "binary" (labels 0/1) or "mse" (labels are ratings).
      sequence_pooling: how `[B, L, D]` activations become `[B, D]`:
        "mean" (over non-padding positions), "sum", or "reject".
      auc_num_thresholds: thresholds of the AUC metric's histogram.
      name: Keras name.

    Raises:
      ModelConfigError: unknown objective or pooling, bad num_dense.
    """
    super().__init__(feature_specs, num_dense, sequence_pooling, name)
    owner = type(self).__name__
    if objective not in OBJECTIVES:
      raise ModelConfigError(
        f"{owner}: unknown objective {objective!r}; choose "
        f"one of {', '.join(OBJECTIVES)}."
      )
    self._objective = objective
    none = keras.losses.Reduction.NONE
    if objective == "binary":
      loss = keras.losses.BinaryCrossentropy(from_logits=True, reduction=none)
      metrics = [
        keras.metrics.AUC(
          num_thresholds=auc_num_thresholds, from_logits=True, name="auc"
        ),
        keras.metrics.BinaryCrossentropy(from_logits=True, name="logloss"),
        keras.metrics.BinaryAccuracy(
          threshold=0.0, name="accuracy"
        ),  # logit > 0
      ]
    else:
      loss = keras.losses.MeanSquaredError(reduction=none)
      metrics = [keras.metrics.RootMeanSquaredError(name="rmse")]
    self.task = tfrs.tasks.Ranking(loss=loss, metrics=metrics)

  @property
  def objective(self) -> str:
    return self._objective

  @abc.abstractmethod
  def logits(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """The model's output before the link function.

    Args:
      activations: feature name -> `[B, D_f]` (or `[B, L, D_f]`, pooled).
      features: the batch; `features["dense"]` `[B, num_dense]` if num_dense.
      training: Keras training flag.

    Returns:
      `[B]` float32 logits.

    Raises:
      FeatureMismatchError: activations/dense features do not match the specs.
    """

  def call(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Predictions `[B]`: probabilities ("binary") or ratings ("mse")."""
    logits = self.logits(activations, features, training=training)
    return tf.sigmoid(logits) if self._objective == "binary" else logits

  def per_example_loss(self, batch: LossInputs) -> tf.Tensor:
    """The task's weighted loss of each example and the metric updates.

    `batch.labels` are `[B]` 0/1 labels or ratings; `batch.features` gives
    `features["dense"]`; `compute_metrics` None updates the metrics.

    Returns:
      `[B]` weighted losses.
    """
    if batch.labels is None:
      raise FeatureMismatchError(
        f"{type(self).__name__}: the loss needs labels [B]."
      )
    # float32 from here, as Keras keeps a mixed policy's outputs and losses.
    logits = tf.cast(
      self.logits(batch.activations, batch.features, training=batch.training),
      tf.float32,
    )[:, tf.newaxis]
    labels = tf.cast(tf.reshape(batch.labels, [-1, 1]), logits.dtype)
    return self.task(
      labels=labels,
      predictions=logits,
      sample_weight=example_weights(batch.sample_weight, logits.dtype),
      training=batch.training,
      compute_metrics=batch.compute_metrics is not False,
    )
