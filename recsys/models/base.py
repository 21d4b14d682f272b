"""Base classes of ranking and retrieval models: loss convention and metrics.

A model receives the embedding backend's activations (dict feature name ->
`[B, D]` or `[B, L, D]`) and the raw batch `features`; it never creates
embedding tables nor touches `tf.tpu` or a distribution strategy.

Loss convention (`compute_loss`), the one TF's custom training loops use:

  per-replica loss = sum_i w_i * loss_i / global_batch_size
                     + sum(model.losses) / num_replicas_in_sync

so that summing the per-replica losses (which is what the gradient all-reduce
does) gives the mean loss over the global batch plus the regularization loss
once. When `global_batch_size` is None it is the local batch size times the
number of replicas in sync (`tf.nn.compute_average_loss`); the regularization
term is scaled by `tf.nn.scale_regularization_loss`. With the default
strategy both divisors are the plain batch size and 1.

Metrics are Keras metrics owned by the model's TFRS task; `compute_loss`
updates them (also inside `strategy.run` with several replicas) and
`model.metrics` lists them so a trainer can reset and read them.
"""

import abc
from collections.abc import Mapping, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import evaluation_hooks as hooks_lib
from recsys.models import layers as model_layers
from recsys.models import (
  retrieval_index,
  retrieval_metrics,
  retrieval_negatives,
  seen_items,
)
from recsys.models.errors import FeatureMismatchError, ModelConfigError

OBJECTIVES = ("binary", "mse")
DEFAULT_KS = (1, 5, 10, 50, 100)


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
def masked_weight(
  sample_weight: tf.Tensor | None, mask: tf.Tensor | None, dtype: tf.DType
) -> tf.Tensor | None:
  """The example weights `[B]` with padding rows (mask 0) weighted 0."""
  if mask is None:
    return sample_weight
  mask = tf.cast(tf.reshape(mask, [-1]), dtype)
  if sample_weight is None:
    return mask
  return tf.cast(tf.reshape(sample_weight, [-1]), dtype) * mask


def _logq_weight(logq_correction: bool | float, owner: str) -> float:
  """The log-Q correction's strength: True is 1, False 0, else the number."""
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


class _ModelBase(keras.Model):
  """What ranking and retrieval models share: specs, variables, regularizers."""

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

  @tf.autograph.experimental.do_not_convert
  def _regularization(self) -> tf.Tensor:
    if not self.losses:
      return tf.constant(0.0)
    return tf.nn.scale_regularization_loss(tf.add_n(self.losses))

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

  def compute_loss(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    labels: tf.Tensor | None = None,
    training: bool = True,
    global_batch_size: int | None = None,
    sample_weight: tf.Tensor | None = None,
    compute_metrics: bool = True,
    mask: tf.Tensor | None = None,
    include_regularization: bool = True,
  ) -> tf.Tensor:
    """The per-replica loss (see the module docstring) and metric updates.

    Args:
      activations: feature name -> `[B, D]` / `[B, L, D]` from the backend.
      features: the batch's features (for `features["dense"]`).
      labels: `[B]` 0/1 labels or ratings.
      training: passed to the layers.
      global_batch_size: examples in the global batch (all replicas).
      sample_weight: optional `[B]` example weights.
      compute_metrics: update `model.metrics` too.
      mask: optional `[B]` 1/0: rows with 0 are padding (a padded eval
        batch) and count in neither the loss nor the metrics.
      include_regularization: add the regularization term.

    Returns:
      Scalar loss.
    """
    if labels is None:
      raise FeatureMismatchError(
        f"{type(self).__name__}.compute_loss needs labels [B]."
      )
    logits = self.logits(activations, features, training=training)[
      :, tf.newaxis
    ]
    labels = tf.cast(tf.reshape(labels, [-1, 1]), logits.dtype)
    sample_weight = masked_weight(sample_weight, mask, logits.dtype)
    per_example = self.task(
      labels=labels,
      predictions=logits,
      sample_weight=sample_weight,
      training=training,
      compute_metrics=compute_metrics,
    )
    loss = average_loss(per_example, global_batch_size)
    return loss + self._regularization() if include_regularization else loss


class RetrievalModel(_ModelBase, metaclass=abc.ABCMeta):
  """A factorized retrieval model: query and candidate embeddings `[B, K]`.

  Training uses `tfrs.tasks.Retrieval` with in-batch negatives (softmax over
  the batch's candidates), optional temperature, log-Q correction and removal
  of accidental hits. Evaluation ranks the whole candidate corpus: index it
  with `index_candidates(ids, embeddings)`, then `compute_loss(...,
  training=False)` updates `FactorizedTopK` hit rates (top-1/5/10/50/100)
  against that index, stored in a fixed-size variable `[V, K]` (V = the
  candidate id feature's vocabulary) so it works inside `tf.function` and
  `strategy.run`.

  Subclasses implement `query_embeddings` and `candidate_embeddings`.
  """

  #: What the Trainer passes a retrieval model's constructor, from the source.
  TRAINER_ARGUMENTS: tuple[str, ...] = (
    "feature_specs",
    "num_dense",
    "query_features",
    "candidate_features",
    "candidate_id_feature",
  )

  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    query_features: Sequence[str],
    candidate_features: Sequence[str],
    candidate_id_feature: str | None,
    embedding_dim: int,
    num_dense: int = 0,
    temperature: float | None = None,
    logq_correction: bool | float = False,
    remove_accidental_hits: bool = True,
    ks: Sequence[int] = DEFAULT_KS,
    sequence_pooling: str = "mean",
    cross_replica_negatives: bool = True,
    name: str | None = None,
  ) -> None:
    """Initializes the task, the corpus index and the metrics.

    Args:
      feature_specs: the data source's categorical features.
      query_features: names of the query tower's features.
      candidate_features: names of the candidate tower's features.
      candidate_id_feature: one-hot feature identifying a candidate (default:
        the first candidate feature); its vocabulary is the corpus.
      embedding_dim: K, the width of query and candidate embeddings.
      num_dense: width of `features["dense"]` (query-side context; 0: none).
      temperature: divide the logits by this (None: 1).
      logq_correction: subtract log(features["candidate_sampling_probability"])
        from each in-batch candidate's logit (sampling-bias correction); a
        number scales that term (True is 1, the consistent correction; above
        1 the model also learns a popularity boost, below 1 a penalty).
      remove_accidental_hits: in-batch negatives with the positive's id do not
        count as negatives.
      ks: cut-offs of the top-k hit rates.
      sequence_pooling: "mean", "sum" or "reject" for `[B, L, D]` activations.
      cross_replica_negatives: on several replicas, every query's in-batch
        negatives are the whole global batch's candidates (gathered from
        every replica), so the loss and the trained model are those of one
        replica on the global batch, on any number of replicas (the
        default). False keeps each replica's own batch as its negatives
        (fewer negatives per query as replicas grow; no all-gather).
      name: Keras name.

    Raises:
      ModelConfigError: inconsistent features or hyper-parameters.
    """
    super().__init__(feature_specs, num_dense, sequence_pooling, name)
    owner = type(self).__name__
    self._cross_replica_negatives = bool(cross_replica_negatives)
    by_name = {s.name: s for s in self._specs}
    self._query_features = list(query_features)
    self._candidate_features = list(candidate_features)
    for role, names in (
      ("query_features", self._query_features),
      ("candidate_features", self._candidate_features),
    ):
      if not names:
        raise ModelConfigError(
          f"{owner}: {role} is empty; name at least one feature."
        )
      unknown = [n for n in names if n not in by_name]
      if unknown:
        raise ModelConfigError(
          f"{owner}: {role} {unknown} are not in feature_specs; known "
          "features: "
          f"{sorted(by_name)}."
        )
    if candidate_id_feature is None:
      candidate_id_feature = self._candidate_features[0]
    if candidate_id_feature not in self._candidate_features:
      raise ModelConfigError(
        f"{owner}: candidate_id_feature {candidate_id_feature!r} is not one "
        "of the "
        f"candidate_features {self._candidate_features}."
      )
    id_spec = by_name[candidate_id_feature]
    if id_spec.multi_hot or id_spec.sequence_length:
      raise ModelConfigError(
        f"{owner}: candidate_id_feature {candidate_id_feature!r} must be "
        "one-hot "
        f"(one id per example); its spec is {id_spec}."
      )
    if temperature is not None and not temperature > 0:
      raise ModelConfigError(
        f"{owner}: temperature must be > 0 or None, got {temperature!r}."
      )
    ks = tuple(sorted(set(int(k) for k in ks)))
    if not ks or ks[0] < 1:
      raise ModelConfigError(
        f"{owner}: ks must be positive integers, got {ks}."
      )
    self._candidate_id_feature = candidate_id_feature
    self._embedding_dim = int(embedding_dim)
    self._logq_weight = _logq_weight(logq_correction, owner)
    self._ks = ks
    self.corpus_index = retrieval_index.CorpusIndex(
      num_candidates=id_spec.vocabulary_size, dim=self._embedding_dim, k=max(ks)
    )
    self.task = tfrs.tasks.Retrieval(
      loss=keras.losses.CategoricalCrossentropy(
        from_logits=True, reduction=keras.losses.Reduction.NONE
      ),
      metrics=retrieval_metrics.CorpusHitRates(
        self.corpus_index, ks=ks, name="hit_rate"
      ),
      temperature=temperature,
      remove_accidental_hits=remove_accidental_hits,
    )

  @property
  def query_features(self) -> list:
    return list(self._query_features)

  @property
  def candidate_features(self) -> list:
    return list(self._candidate_features)

  @property
  def candidate_id_feature(self) -> str:
    return self._candidate_id_feature

  @property
  def embedding_dim(self) -> int:
    return self._embedding_dim

  @property
  def ks(self) -> tuple:
    return self._ks

  @abc.abstractmethod
  def query_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Query embeddings `[B, K]` from the query features' activations."""

  @abc.abstractmethod
  def candidate_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Candidate embeddings `[B, K]` from the candidate activations."""

  def call(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Affinity `[B]` of each row's query with the same row's candidate."""
    q = self.query_embeddings(activations, features, training=training)
    c = self.candidate_embeddings(activations, features, training=training)
    return tf.reduce_sum(q * c, axis=-1)

  @tf.autograph.experimental.do_not_convert
  def candidate_ids(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """The candidate ids `[B]` (int64) of `features["categorical"]`."""
    try:
      ids = features["categorical"][self._candidate_id_feature]
    except (KeyError, TypeError) as e:
      raise FeatureMismatchError(
        f"{type(self).__name__}: the batch has no features['categorical']"
        f"[{self._candidate_id_feature!r}] (the candidate id feature)."
      ) from e
    return tf.reshape(tf.cast(ids, tf.int64), [-1])

  @tf.autograph.experimental.do_not_convert
  def weighted_sampling_probability(
    self, features: Mapping[str, tf.Tensor]
  ) -> tf.Tensor:
    """`features["candidate_sampling_probability"]` `[B]` raised to the
    log-Q strength, so that subtracting its log subtracts strength * log Q."""
    probability = tf.reshape(features["candidate_sampling_probability"], [-1])
    if self._logq_weight == 1.0:
      return probability
    return tf.pow(probability, tf.cast(self._logq_weight, probability.dtype))

  def compute_loss(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    labels: tf.Tensor | None = None,
    training: bool = True,
    global_batch_size: int | None = None,
    sample_weight: tf.Tensor | None = None,
    compute_metrics: bool | None = None,
    mask: tf.Tensor | None = None,
    include_regularization: bool = True,
  ) -> tf.Tensor:
    """In-batch softmax loss (per-replica convention of the module docstring).

    Row i's candidate is the positive of query i; the other rows' candidates
    are its negatives: those of the whole global batch (every replica's),
    or of this replica's batch only with `cross_replica_negatives=False`.

    Args:
      activations: feature name -> activation, query and candidate features.
      features: the batch (candidate ids, optional
        "candidate_sampling_probability" `[B]`).
      labels: ignored (retrieval labels are all ones).
      training: passed to the layers.
      global_batch_size: examples in the global batch (all replicas).
      sample_weight: optional `[B]` query weights.
      compute_metrics: update the corpus hit rates (default: not training);
        needs `index_candidates` first. When the batch carries
        `features["seen_candidate_ids"]` (`recsys.models.seen_items`), each
        query's seen candidates are left out of its ranking (never its
        true candidate).
      mask: optional `[B]` 1/0: rows with 0 are padding (a padded eval
        batch): neither queries that count nor in-batch negatives.
      include_regularization: add the regularization term.

    Returns:
      Scalar loss.

    Raises:
      FeatureMismatchError: log-Q correction without sampling probabilities.
      RuntimeError: hit rates requested before `index_candidates`.
    """
    del labels
    if compute_metrics is None:
      compute_metrics = not training
    if compute_metrics and not self.corpus_index.is_indexed:
      raise RuntimeError(
        f"{type(self).__name__}: corpus hit rates need the candidate corpus: "
        "call "
        "model.index_candidates(ids, embeddings) before compute_loss(..., "
        "compute_metrics=True), or pass compute_metrics=False."
      )
    features = features or {}
    q = self.query_embeddings(activations, features, training=training)
    c = self.candidate_embeddings(activations, features, training=training)
    sampling_probability = None
    if self._logq_weight:
      if "candidate_sampling_probability" not in features:
        raise FeatureMismatchError(
          f"{type(self).__name__}: logq_correction={self._logq_weight:g} but "
          "the batch has no "
          "features['candidate_sampling_probability'] (got keys "
          f"{sorted(features)}); "
          "use a source that provides it or set logq_correction=False."
        )
      sampling_probability = tf.cast(
        self.weighted_sampling_probability(features), q.dtype
      )
    ids = self.candidate_ids(features) if "categorical" in features else None
    valid = None if mask is None else tf.reshape(mask, [-1]) > 0
    candidates = self.in_batch_candidates(c, ids, sampling_probability, valid)
    c_all, ids_all, sampling_probability, valid = candidates
    score_mask = None
    if valid is not None:  # padding rows are no candidate of any query
      score_mask = tf.broadcast_to(
        valid[tf.newaxis, :], [tf.shape(q)[0], tf.shape(c_all)[0]]
      )
    per_example = self.task(
      q,
      c_all,
      sample_weight=masked_weight(sample_weight, mask, q.dtype),
      candidate_sampling_probability=sampling_probability,
      candidate_ids=ids_all,
      compute_metrics=False,  # below: this replica's queries, seen items
      compute_batch_metrics=False,
      score_mask=score_mask,
    )
    if compute_metrics:
      self.hit_rates.update_state(
        q,
        c,
        ids,
        sample_weight=masked_weight(sample_weight, mask, q.dtype),
        exclusions=features.get(seen_items.SEEN_FEATURE),
      )
    loss = average_loss(per_example, global_batch_size)
    return loss + self._regularization() if include_regularization else loss

  @property
  def hit_rates(self) -> retrieval_metrics.CorpusHitRates:
    """The corpus top-k hit rates that evaluation updates."""
    return self.task.factorized_metrics[0]

  @property
  def cross_replica_negatives(self) -> bool:
    """Whether in-batch negatives span every replica's batch."""
    return self._cross_replica_negatives

  @tf.autograph.experimental.do_not_convert
  def in_batch_candidates(
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
    if not self._cross_replica_negatives:
      return embeddings, ids, sampling_probability, valid
    return retrieval_negatives.global_batch(
      embeddings, ids, sampling_probability, valid
    )

  def evaluation_hooks(
    self, context: hooks_lib.EvaluationContext
  ) -> hooks_lib.EvaluationHooks:
    """Evaluation ranks the corpus (`evaluation_hooks.CorpusEvaluation`):
    index it first, hit rates in evaluation only, seen items left out."""
    return hooks_lib.CorpusEvaluation(self, context)

  def index_candidates(
    self, candidate_ids: tf.Tensor, candidate_embeddings: tf.Tensor
  ) -> None:
    """Stores the corpus for hit-rate evaluation and serving.

    Args:
      candidate_ids: `[N]` ids in [0, vocabulary size of the id feature).
      candidate_embeddings: `[N, K]` from `candidate_embeddings`.
    """
    self.corpus_index.index(candidate_embeddings, candidate_ids)

  def evaluate_retrieval(
    self,
    query_embeddings: tf.Tensor,
    candidate_embeddings: tf.Tensor,
    candidate_ids: tf.Tensor,
    true_ids: tf.Tensor,
    ks: Sequence[int] | None = None,
  ) -> dict[str, float]:
    """Top-k hit rates of queries against a corpus, by brute force.

    See `recsys.models.retrieval_metrics.hit_rates`; `ks` defaults to the
    model's.
    """
    return retrieval_metrics.hit_rates(
      query_embeddings,
      candidate_embeddings,
      candidate_ids,
      true_ids,
      ks or self._ks,
    )

  def serving_index(
    self,
    k: int = 100,
    query_model: keras.Model | None = None,
    use_scann: str = "auto",
  ) -> tfrs.layers.factorized_top_k.TopK:
    """A top-k index over the indexed corpus for serving (ScaNN when installed).

    See `recsys.models.retrieval_index.make_serving_index`.
    """
    ids, embeddings = self.corpus_index.corpus()
    return retrieval_index.make_serving_index(
      embeddings, ids, k=k, query_model=query_model, use_scann=use_scann
    )
