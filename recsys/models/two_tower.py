"""Two-tower retrieval: query and candidate towers over id and side features.

Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus Item
Recommendations" (RecSys 2019): in-batch softmax with log-Q correction,
L2-normalized embeddings and a temperature.
"""

from collections.abc import Mapping, Sequence

import gin
import tensorflow as tf

from recsys._keras import keras
from recsys.data.spec import FeatureSpec
from recsys.models import layers as model_layers
from recsys.models.base import DEFAULT_KS, RetrievalModel
from recsys.models.errors import ModelConfigError


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

  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    query_features: Sequence[str],
    candidate_features: Sequence[str],
    candidate_id_feature: str | None = None,
    num_dense: int = 0,
    query_tower: Sequence[int] = (64, 32),
    candidate_tower: Sequence[int] = (64, 32),
    normalize: bool = True,
    temperature: float | None = 0.1,
    logq_correction: bool = False,
    remove_accidental_hits: bool = True,
    l2_regularization: float = 0.0,
    ks: Sequence[int] = DEFAULT_KS,
    sequence_pooling: str = "mean",
    name: str | None = "two_tower",
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
        -log(features["candidate_sampling_probability"]).
      remove_accidental_hits: do not count in-batch copies of the positive
        candidate as negatives.
      l2_regularization: L2 factor on every tower kernel (0: none).
      ks: cut-offs of the corpus hit rates.
      sequence_pooling: "mean", "sum" or "reject" for `[B, L, D]` activations.
      name: Keras name.

    Raises:
      ModelConfigError: empty towers, towers of different output widths, or
        inconsistent features.
    """
    query_tower, candidate_tower = tuple(query_tower), tuple(candidate_tower)
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
      name=name,
    )
    self._normalize = normalize
    regularizer = (
      keras.regularizers.L2(l2_regularization) if l2_regularization else None
    )
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

  def _tower(
    self, tower: keras.Sequential, names: list, activations, extra, training
  ):
    vectors = self._vectors(activations, names, allow_extra=True)
    x = tower(tf.concat(extra + vectors, axis=-1), training=training)
    return tf.math.l2_normalize(x, axis=-1) if self._normalize else x

  def query_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Query embeddings `[B, K]`.

    Args:
      activations: at least the query features' activations.
      features: the batch (for `features["dense"]` when num_dense > 0).
      training: Keras training flag.

    Raises:
      FeatureMismatchError: a query feature or the dense features are missing.
    """
    dense = model_layers.dense_input(features, self.num_dense, "TwoTower")
    extra = [dense] if dense is not None else []
    return self._tower(
      self.query_tower, self._query_features, activations, extra, training
    )

  def candidate_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Candidate embeddings `[B, K]` (features unused; kept for symmetry).

    Raises:
      FeatureMismatchError: a candidate feature is missing.
    """
    del features
    return self._tower(
      self.candidate_tower, self._candidate_features, activations, [], training
    )
