"""The retrieval loss: a softmax over in-batch candidates, as TFRS's task.

`InBatchSoftmax` is the loss part of a retrieval model (the corpus index,
the hit rates and the seen-item exclusion are parts of their own:
`retrieval_index`, `retrieval_metrics`, `seen_items`). Row i's candidate is
the positive of query i; the other rows' candidates are its negatives: the
whole global batch's (every replica's, `retrieval_negatives.global_batch`)
or this replica's only. It takes what a loss needs (the two embeddings, the
candidate ids, sampling probabilities, example weights, which rows are real)
and returns each query's loss; averaging over the global batch and the
regularization are the model's convention (`recsys.models.base`).

Example:
  >>> task = InBatchSoftmax(temperature=0.05, logq_correction=True)
  >>> probability = task.sampling_probability(features, tf.float32)
  >>> per_query = task.loss(q, c, ids, probability)  # [B]
"""

from collections.abc import Mapping

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys._keras import keras
from recsys.models.errors import FeatureMismatchError, ModelConfigError
from recsys.models.retrieval import negatives as retrieval_negatives

#: The batch feature with each example's candidate sampling probability.
SAMPLING_PROBABILITY = "candidate_sampling_probability"


def logq_weight(logq_correction: bool | float, owner: str) -> float:
  """The log-Q correction's strength: True is 1, False 0, else the number.

  Raises:
    ModelConfigError: not a bool or a number >= 0.
  """
  try:
    weight = float(logq_correction)
  except (TypeError, ValueError):
    weight = float("nan")
  if not weight >= 0:
    raise ModelConfigError(
      f"{owner}: logq_correction must be a bool or a number >= 0 (the "
      f"strength of the log-Q term; True is 1), got {logq_correction!r}."
    )
  return weight


class InBatchSoftmax:
  """Softmax cross-entropy of each query over the batch's candidates.

  Args:
    temperature: divide the logits by this (None: 1).
    logq_correction: subtract strength * log(sampling probability) from
      each in-batch candidate's logit (True is 1; False: none).
    remove_accidental_hits: in-batch negatives with the positive's id do
      not count as negatives.
    cross_replica_negatives: on several replicas, negatives are every
      replica's candidates (False: this replica's only).
    owner: the model's name, for error messages.

  Raises:
    ModelConfigError: temperature <= 0, or a bad logq_correction.
  """

  def __init__(
    self,
    temperature: float | None = None,
    logq_correction: bool | float = False,
    remove_accidental_hits: bool = True,
    cross_replica_negatives: bool = True,
    owner: str = "InBatchSoftmax",
  ) -> None:
    if temperature is not None and not temperature > 0:
      raise ModelConfigError(
        f"{owner}: temperature must be > 0 or None, got {temperature!r}."
      )
    self.owner = owner
    self.logq_weight = logq_weight(logq_correction, owner)
    self.cross_replica_negatives = bool(cross_replica_negatives)
    self._task = tfrs.tasks.Retrieval(
      loss=keras.losses.CategoricalCrossentropy(
        from_logits=True, reduction=keras.losses.Reduction.NONE
      ),
      temperature=temperature,
      remove_accidental_hits=remove_accidental_hits,
    )

  @tf.autograph.experimental.do_not_convert
  def weighted_sampling_probability(
    self, features: Mapping[str, tf.Tensor]
  ) -> tf.Tensor:
    """`features["candidate_sampling_probability"]` `[B]` raised to the
    log-Q strength, so that subtracting its log subtracts strength * log Q."""
    probability = tf.reshape(features[SAMPLING_PROBABILITY], [-1])
    if self.logq_weight == 1.0:
      return probability
    return tf.pow(probability, tf.cast(self.logq_weight, probability.dtype))

  @tf.autograph.experimental.do_not_convert
  def sampling_probability(
    self, features: Mapping[str, tf.Tensor], dtype: tf.DType
  ) -> tf.Tensor | None:
    """What the log-Q correction subtracts the log of (None: no correction).

    Raises:
      FeatureMismatchError: the correction is on but the batch has no
        sampling probabilities.
    """
    if not self.logq_weight:
      return None
    if SAMPLING_PROBABILITY not in features:
      raise FeatureMismatchError(
        f"{self.owner}: logq_correction={self.logq_weight:g} but the batch "
        f"has no features['{SAMPLING_PROBABILITY}'] (got keys "
        f"{sorted(features)}); use a source that provides it or set "
        "logq_correction=False."
      )
    return tf.cast(self.weighted_sampling_probability(features), dtype)

  @tf.autograph.experimental.do_not_convert
  def candidates(
    self,
    embeddings: tf.Tensor,
    ids: tf.Tensor | None = None,
    sampling_probability: tf.Tensor | None = None,
    valid: tf.Tensor | None = None,
  ) -> tuple:
    """The candidates in-batch negatives come from: `[N, ...]` each.

    The replica's own rows `[B, ...]` with one replica or
    `cross_replica_negatives=False`; otherwise every replica's, this
    replica's first (`retrieval_negatives.global_batch`), so that row i
    stays query i's positive.
    """
    if not self.cross_replica_negatives:
      return embeddings, ids, sampling_probability, valid
    return retrieval_negatives.global_batch(
      embeddings, ids, sampling_probability, valid
    )

  def loss(
    self,
    query_embeddings: tf.Tensor,
    candidate_embeddings: tf.Tensor,
    candidate_ids: tf.Tensor | None = None,
    sampling_probability: tf.Tensor | None = None,
    sample_weight: tf.Tensor | None = None,
    valid: tf.Tensor | None = None,
  ) -> tf.Tensor:
    """Each query's loss `[B]` (weighted by `sample_weight`).

    Args:
      query_embeddings: `[B, K]`.
      candidate_embeddings: `[B, K]`, row i the positive of query i.
      candidate_ids: `[B]` (accidental hits; None: not removed).
      sampling_probability: `[B]` from `sampling_probability` (None: no
        log-Q correction).
      sample_weight: `[B]` query weights (padding rows 0).
      valid: `[B]` bool, False for padding rows: no query's negative.
    """
    c_all, ids_all, probability, valid = self.candidates(
      candidate_embeddings, candidate_ids, sampling_probability, valid
    )
    score_mask = None
    if valid is not None:  # padding rows are no candidate of any query
      score_mask = tf.broadcast_to(
        valid[tf.newaxis, :],
        [tf.shape(query_embeddings)[0], tf.shape(c_all)[0]],
      )
    return self._task(
      query_embeddings,
      c_all,
      sample_weight=sample_weight,
      candidate_sampling_probability=probability,
      candidate_ids=ids_all,
      compute_metrics=False,  # the model's hit rates rank the corpus
      compute_batch_metrics=False,
      score_mask=score_mask,
    )
