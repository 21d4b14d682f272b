"""Two-tower retrieval: query and candidate towers over id and side features.

Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus Item
Recommendations" (RecSys 2019): in-batch softmax with log-Q correction,
L2-normalized embeddings and a temperature; optionally the whole corpus or
in-batch + uniformly sampled corpus items as negatives
(`recsys.models.retrieval.negatives`).
"""

from collections.abc import Mapping, Sequence
from typing import Annotated

import gin
import tensorflow as tf

from recsys import ranges
from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import layers as model_layers
from recsys.models.base import example_weights
from recsys.models.errors import ModelConfigError
from recsys.models.layers import Pooling
from recsys.models.loss_inputs import LossInputs
from recsys.models.retrieval import negatives as retrieval_negatives
from recsys.models.retrieval.model import DEFAULT_KS, RetrievalModel
from recsys.models.retrieval.negatives import NEGATIVES


@gin.register
class TwoTower(RetrievalModel):
  """Two-tower retrieval model.

  Query tower: concat(query feature activations [, features["dense"]]) -> MLP
  -> `[B, K]`; candidate tower: concat(candidate feature activations) -> MLP
  -> `[B, K]`; both optionally L2-normalized. Multi-hot and weighted side
  features arrive already combined by the backend (`[B, D]`); sequence
  features are pooled. Hidden layers use ReLU, the last layer is linear.

  Example:
    >>> specs = [FeatureSpec("user", 23), FeatureSpec("item", 29),
    ...          FeatureSpec("genre", 7, multi_hot=True, max_ids=3)]
    >>> model = TwoTower(specs, query_features=["user"],
    ...                  candidate_features=["item", "genre"],
    ...                  query_tower=(16, 8), candidate_tower=(16, 8))
    >>> acts = {"user": tf.zeros([5, 7]), "item": tf.zeros([5, 11]),
    ...         "genre": tf.zeros([5, 7])}
    >>> model.query_embeddings(acts).shape
    TensorShape([5, 8])
  """

  @ranges.checked
  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    query_features: ranges.Names,
    candidate_features: ranges.Names,
    candidate_id_feature: ranges.Name | None = None,
    num_dense: ranges.NonNegativeInt = 0,
    query_tower: ranges.LayerSizes = (64, 32),
    candidate_tower: ranges.LayerSizes = (64, 32),
    normalize: ranges.Flag = True,
    temperature: ranges.Positive | None = 0.1,
    logq_correction: Annotated[
      bool | float, ranges.AnyOf((ranges.Bool(), ranges.Real(0)))
    ] = False,
    remove_accidental_hits: ranges.Flag = True,
    l2_regularization: ranges.NonNegative = 0.0,
    ks: ranges.Cutoffs = DEFAULT_KS,
    sequence_pooling: Pooling = "mean",
    negatives: Annotated[str, ranges.Choice(NEGATIVES)] = "in_batch",
    num_sampled_negatives: ranges.NonNegativeInt = 0,
    ignore_features: ranges.Names = (),
    cross_replica_negatives: ranges.Flag = True,
    name: ranges.Name | None = "two_tower",
  ) -> None:
    """Builds the towers (their variables are created on the first call).

    Args:
      feature_specs: the data source's categorical features.
      query_features: names of the query tower's features.
      candidate_features: names of the candidate tower's features.
      candidate_id_feature: the one-hot candidate id feature (default: the
        first candidate feature); its vocabulary is the corpus.
      num_dense: width of `features["dense"]`, fed to the query tower (0: none).
      query_tower: layer sizes of the query MLP; the last is K.
      candidate_tower: layer sizes of the candidate MLP; the last must be K too.
      normalize: L2-normalize both embeddings (scores are cosines; use a
        temperature well below 1).
      temperature: softmax temperature (None: 1).
      logq_correction: correct in-batch logits by
        -log(features["candidate_sampling_probability"]); a number scales
        the term (True is 1; see `RetrievalModel`).
      remove_accidental_hits: do not count in-batch copies of the positive
        candidate as negatives.
      l2_regularization: L2 factor on every tower kernel (0: none).
      ks: cut-offs of the corpus hit rates.
      sequence_pooling: "mean", "sum" or "reject" for `[B, L, D]` activations.
      negatives: "in_batch" (the batch's other candidates), or in-batch plus
        a query-side softmax over "corpus" (every corpus item) or "mixed"
        (the batch's and `num_sampled_negatives` uniform corpus items)
        against a bank of the candidates' latest embeddings; see
        `recsys.models.retrieval.negatives`. Evaluation is the same for all.
      num_sampled_negatives: corpus items drawn per batch ("mixed" only).
      ignore_features: query or candidate features the towers leave out
        (e.g. "user_id" for a query tower of the user's history and side
        features only: it must generalize instead of memorizing each user).
      cross_replica_negatives: in-batch (and "mixed") negatives are the
        whole global batch's candidates on any number of replicas, so N
        replicas train the model one replica trains on the same global
        batches (the default); False: each replica's own batch only (see
        `RetrievalModel`).
      name: Keras name.

    Raises:
      ModelConfigError: empty towers, towers of different output widths,
        inconsistent features, or an unknown `negatives`.
    """
    query_tower, candidate_tower = tuple(query_tower), tuple(candidate_tower)
    ignored = set(ignore_features)
    unknown = sorted(ignored - set(query_features) - set(candidate_features))
    if unknown:
      raise ModelConfigError(
        f"TwoTower: ignore_features {unknown} are not among the query "
        f"features {list(query_features)} or candidate features "
        f"{list(candidate_features)}."
      )
    query_features = [f for f in query_features if f not in ignored]
    candidate_features = [f for f in candidate_features if f not in ignored]
    if not query_tower or not candidate_tower:
      raise ModelConfigError(
        f"TwoTower: query_tower {query_tower} and candidate_tower "
        f"{candidate_tower} "
        "need at least one layer each (the last size is the embedding width K)."
      )
    if query_tower[-1] != candidate_tower[-1]:
      raise ModelConfigError(
        f"TwoTower: query_tower ends in {query_tower[-1]} but candidate_tower "
        "ends "
        f"in {candidate_tower[-1]}; both towers must output the same width K."
      )
    super().__init__(
      feature_specs,
      query_features,
      candidate_features,
      candidate_id_feature,
      embedding_dim=query_tower[-1],
      num_dense=num_dense,
      temperature=temperature,
      logq_correction=logq_correction,
      remove_accidental_hits=remove_accidental_hits,
      ks=ks,
      sequence_pooling=sequence_pooling,
      cross_replica_negatives=cross_replica_negatives,
      name=name,
    )
    self._normalize = normalize
    retrieval_negatives.check_negatives(
      negatives, num_sampled_negatives, "TwoTower"
    )
    self._negatives = negatives
    self._num_sampled = int(num_sampled_negatives)
    self._temperature = temperature
    self.candidate_bank = None
    if negatives != "in_batch":
      id_spec = {f.name: f for f in self.feature_specs}[
        self.candidate_id_feature
      ]
      self.candidate_bank = retrieval_negatives.CandidateBank(
        id_spec.vocabulary_size, query_tower[-1]
      )
    regularizer = model_layers.l2_regularizer(l2_regularization)
    self.query_tower = model_layers.mlp(
      query_tower,
      final_activation=None,
      kernel_regularizer=regularizer,
      name="query_tower",
    )
    self.candidate_tower = model_layers.mlp(
      candidate_tower,
      final_activation=None,
      kernel_regularizer=regularizer,
      name="candidate_tower",
    )

  @tf.autograph.experimental.do_not_convert
  def _tower(
    self, tower: keras.Sequential, names: list, activations, extra, training
  ):
    vectors = self._vectors(activations, names, allow_extra=True)
    x = tower(tf.concat(extra + vectors, axis=-1), training=training)
    return tf.math.l2_normalize(x, axis=-1) if self._normalize else x

  @tf.autograph.experimental.do_not_convert
  def query_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    dense = model_layers.dense_input(features, self.num_dense, "TwoTower")
    extra = [dense] if dense is not None else []
    return self._tower(
      self.query_tower, self._query_features, activations, extra, training
    )

  @tf.autograph.experimental.do_not_convert
  def candidate_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    del features
    return self._tower(
      self.candidate_tower, self._candidate_features, activations, [], training
    )

  @property
  def negatives(self) -> str:
    """The training softmax's negatives: "in_batch", "corpus" or "mixed"."""
    return self._negatives

  def per_example_loss(self, batch: LossInputs) -> tf.Tensor:
    """`RetrievalModel.per_example_loss`, with `negatives` in training.

    With "corpus" or "mixed" a training step adds to the in-batch loss a
    softmax over the bank's corpus rows (`negatives`;
    it trains the query tower only), and stores the batch's candidate
    embeddings in `candidate_bank` for the next steps. Evaluation
    (training=False) and "in_batch" use the in-batch task and its metrics.
    """
    in_batch = super().per_example_loss(batch)
    if not batch.training or self.candidate_bank is None:
      return in_batch
    activations, features = batch.activations, batch.features or {}
    q = self.query_embeddings(activations, features, training=True)
    c = tf.stop_gradient(
      self.candidate_embeddings(activations, features, training=True)
    )
    ids = self.candidate_ids(features)
    table, filled = self.candidate_bank.with_fresh(ids, c)
    if self._negatives == "corpus":
      per_example = retrieval_negatives.corpus_softmax_loss(
        q, ids, table, filled, self._temperature
      )
    else:
      task, probability = self.retrieval_task, None
      if task.logq_weight:
        probability = task.weighted_sampling_probability(features)
      weight = example_weights(batch.sample_weight, c.dtype)
      valid = None if weight is None else weight > 0
      c_all, ids_all, probability, valid = task.candidates(
        c, ids, probability, valid
      )
      per_example = retrieval_negatives.mixed_softmax_loss(
        q,
        c_all,
        ids_all,
        probability,
        table,
        filled,
        retrieval_negatives.sample_filled(
          filled, self._num_sampled, self.candidate_bank.draw_seed()
        ),
        self._temperature,
        valid=valid,
      )
    self.candidate_bank.store(table, filled)
    weight = example_weights(batch.sample_weight, per_example.dtype)
    if weight is not None:
      per_example *= weight
    return in_batch + per_example
