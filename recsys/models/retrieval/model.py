"""Retrieval models: a query tower and a candidate tower composed with
their parts, as TFRS splits them.

A `RetrievalModel` owns the towers (subclasses: `query_embeddings`,
`candidate_embeddings`) and composes

  retrieval_task    the loss (`InBatchSoftmax`: in-batch softmax, log-Q
                    correction, accidental hits, cross-replica negatives)
  corpus_index      the candidate corpus (`retrieval_index.CorpusIndex`);
                    `serving_index` builds the export's (ScaNN or exact)
  hit_rates         the corpus top-k hit rates evaluation updates
                    (`retrieval_metrics.CorpusHitRates`)
  seen exclusion    a batch's `features["seen_candidate_ids"]`
                    (`seen_items.exclusions_of`), left out of the ranking

`per_example_loss` only wires them: towers -> the task's per-query loss;
hit rates when evaluating (the loop scales it: `recsys.models.base`).
"""

import abc
from collections.abc import Mapping, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import evaluation_hooks as hooks_lib
from recsys.models.base import _ModelBase, example_weights
from recsys.models.errors import FeatureMismatchError, ModelConfigError
from recsys.models.loss_inputs import LossInputs
from recsys.models.retrieval import index as retrieval_index
from recsys.models.retrieval import metrics as retrieval_metrics
from recsys.models.retrieval import seen_items
from recsys.models.retrieval import task as retrieval_task

DEFAULT_KS = (1, 5, 10, 50, 100)


def require_features(
  owner: str,
  role: str,
  names: Sequence[str],
  by_name: Mapping[str, FeatureSpec],
  fix: str = "",
) -> None:
  """Refuses `names` that `feature_specs` (`by_name`) does not have.

  Raises:
    ModelConfigError: names the missing ones, the known ones and `fix`.
  """
  unknown = [n for n in names if n not in by_name]
  if unknown:
    raise ModelConfigError(
      f"{owner}: {role} {unknown} are not in feature_specs; known features: "
      f"{sorted(by_name)}.{fix}"
    )


class RetrievalModel(_ModelBase, metaclass=abc.ABCMeta):
  """A factorized retrieval model: query and candidate embeddings `[B, K]`.

  Training minimizes `retrieval_task` (`InBatchSoftmax`: a softmax over
  the batch's candidates, optional temperature, log-Q correction and removal
  of accidental hits). Evaluation ranks the whole candidate corpus: index it
  with `index_candidates(ids, embeddings)` (`corpus_index`, a fixed-size
  variable `[V, K]`, V = the candidate id feature's vocabulary, so it works
  inside `tf.function` and `strategy.run`), then `per_example_loss(
  LossInputs(..., training=False))` (or `compute_loss`) updates `hit_rates`
  (top-1/5/10/50/100) against it, leaving out each query's seen candidates
  when the batch carries them.

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
    """Initializes the loss task, the corpus index and the hit rates.

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
      require_features(owner, role, names, by_name)
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
    self.retrieval_task = retrieval_task.InBatchSoftmax(
      temperature=temperature,
      logq_correction=logq_correction,
      remove_accidental_hits=remove_accidental_hits,
      cross_replica_negatives=cross_replica_negatives,
      owner=owner,
    )
    ks = tuple(sorted(set(int(k) for k in ks)))
    if not ks or ks[0] < 1:
      raise ModelConfigError(
        f"{owner}: ks must be positive integers, got {ks}."
      )
    self._candidate_id_feature = candidate_id_feature
    self._embedding_dim = int(embedding_dim)
    self._ks = ks
    self.corpus_index = retrieval_index.CorpusIndex(
      num_candidates=id_spec.vocabulary_size, dim=self._embedding_dim, k=max(ks)
    )
    self.hit_rates = retrieval_metrics.CorpusHitRates(
      self.corpus_index, ks=ks, name="hit_rate"
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
    """Query embeddings `[B, K]` from the query features' activations.

    Args:
      activations: feature name -> activation; at least the query features'.
      features: the batch (for `features["dense"]` when num_dense > 0).
      training: Keras training flag.

    Raises:
      FeatureMismatchError: a query feature or the dense features are missing.
    """

  @abc.abstractmethod
  def candidate_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Candidate embeddings `[B, K]` from the candidate activations.

    The arguments are `query_embeddings`'s (a model may ignore `features`).

    Raises:
      FeatureMismatchError: a candidate feature is missing.
    """

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

  def per_example_loss(self, batch: LossInputs) -> tf.Tensor:
    """The in-batch softmax loss of each query `[B]` (`recsys.models.base`).

    Row i's candidate is the positive of query i; the other rows' candidates
    are its negatives: those of the whole global batch (every replica's),
    or of this replica's batch only with `cross_replica_negatives=False`.
    The loss itself is `retrieval_task`'s; this turns the batch into what
    it needs and updates `hit_rates`.

    Of `batch`: the features give the candidate ids and an optional
    "candidate_sampling_probability" `[B]`; labels are ignored (retrieval
    labels are all ones); a row weighted 0 is no query that counts and no
    in-batch negative. `compute_metrics` updates the corpus hit rates
    (None: when not training) and needs `index_candidates` first; when the
    batch carries `features["seen_candidate_ids"]`
    (`recsys.models.retrieval.seen_items`), each query's seen candidates
    are left out of its ranking (never its true candidate).

    Returns:
      `[B]` weighted losses.

    Raises:
      FeatureMismatchError: log-Q correction without sampling probabilities.
      RuntimeError: hit rates requested before `index_candidates`.
    """
    training, compute_metrics = batch.training, batch.compute_metrics
    if compute_metrics is None:
      compute_metrics = not training
    if compute_metrics and not self.corpus_index.is_indexed:
      raise RuntimeError(
        f"{type(self).__name__}: corpus hit rates need the candidate corpus: "
        "call model.index_candidates(ids, embeddings) before a loss of "
        "LossInputs(..., compute_metrics=True), or pass "
        "compute_metrics=False."
      )
    features = batch.features or {}
    q = self.query_embeddings(batch.activations, features, training=training)
    c = self.candidate_embeddings(
      batch.activations, features, training=training
    )
    probability = self.retrieval_task.sampling_probability(features, q.dtype)
    ids = self.candidate_ids(features) if "categorical" in features else None
    weight = example_weights(batch.sample_weight, q.dtype)
    per_example = self.retrieval_task.loss(
      q,
      c,
      ids,
      probability,
      sample_weight=weight,
      valid=None if weight is None else weight > 0,
    )
    if compute_metrics:  # this replica's queries against the whole corpus
      self.hit_rates.update_state(
        q,
        c,
        ids,
        sample_weight=weight,
        exclusions=seen_items.exclusions_of(features),
      )
    return per_example

  @property
  def cross_replica_negatives(self) -> bool:
    """Whether in-batch negatives span every replica's batch."""
    return self.retrieval_task.cross_replica_negatives

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

    See `recsys.models.retrieval.metrics.hit_rates`; `ks` defaults to the
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

    See `recsys.models.retrieval.index.make_serving_index`.
    """
    ids, embeddings = self.corpus_index.corpus()
    return retrieval_index.make_serving_index(
      embeddings, ids, k=k, query_model=query_model, use_scann=use_scann
    )
