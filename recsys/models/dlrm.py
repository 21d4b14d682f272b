"""DLRM: bottom MLP on dense features, dot interaction with embeddings, top MLP.

Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems" (2019), https://arxiv.org/abs/1906.00091.
"""

from collections.abc import Mapping, Sequence

import gin
import tensorflow as tf

from recsys import ranges
from recsys.feature_spec import FeatureSpec
from recsys.models import layers as model_layers
from recsys.models.base import AucThresholds, Objective, RankingModel
from recsys.models.errors import EmbeddingDimError, ModelConfigError
from recsys.models.layers import Pooling


@gin.register
class DLRM(RankingModel):
  """DLRM ranking model.

  `features["dense"]` `[B, num_dense]` goes through the bottom MLP to `[B, D]`;
  with the activations of every categorical feature (each `[B, D]`; sequence
  features pooled) it forms F vectors whose pairwise dot products
  (`layers.DotInteraction`, the TFRS layer's values, with or without
  self-interaction) are concatenated with the bottom output and fed to the top
  MLP, which ends in one logit. All activations must share the embedding dim
  D, and the bottom MLP must end in D.

  Example:
    >>> specs = [FeatureSpec("user", 23), FeatureSpec("item", 29)]
    >>> model = DLRM(specs, num_dense=3, bottom_mlp=(16, 8), top_mlp=(16,))
    >>> acts = {"user": tf.zeros([5, 8]), "item": tf.zeros([5, 8])}
    >>> model(acts, {"dense": tf.zeros([5, 3])}).shape
    TensorShape([5])
  """

  @ranges.checked
  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    num_dense: ranges.NonNegativeInt = 0,
    bottom_mlp: ranges.LayerSizes = (64, 16),
    top_mlp: ranges.LayerSizes = (64, 32),
    self_interaction: ranges.Flag = False,
    objective: Objective = "binary",
    sequence_pooling: Pooling = "mean",
    l2_regularization: ranges.NonNegative = 0.0,
    auc_num_thresholds: AucThresholds = 1000,
    name: ranges.Name | None = "dlrm",
  ) -> None:
    """Builds the layers (their variables are created on the first call).

    Args:
      feature_specs: the data source's categorical features (model order).
      num_dense: width of `features["dense"]`; 0 -> no bottom MLP.
      bottom_mlp: layer sizes of the bottom MLP (all ReLU); the last size must
        equal the embedding dim.
      top_mlp: hidden layer sizes of the top MLP (ReLU); a linear layer of
        width 1 is appended.
      self_interaction: include each vector's dot product with itself.
      l2_regularization: L2 factor on every MLP kernel (0: none).
      objective, sequence_pooling, auc_num_thresholds, name: `RankingModel`'s.

    Raises:
      ModelConfigError: bad sizes, objective or pooling; a model with neither
        dense nor two or more interacting vectors.
    """
    super().__init__(
      feature_specs,
      num_dense=num_dense,
      objective=objective,
      sequence_pooling=sequence_pooling,
      auc_num_thresholds=auc_num_thresholds,
      name=name,
    )
    num_vectors = len(self.feature_specs) + (1 if num_dense else 0)
    if num_vectors < 2:
      raise ModelConfigError(
        f"DLRM: dot interaction needs at least two vectors, got {num_vectors} "
        f"(features {self.feature_names}, num_dense={num_dense}); add "
        "features or "
        "use DCNv2."
      )
    if num_dense and not tuple(bottom_mlp):
      raise ModelConfigError(
        f"DLRM: num_dense={num_dense} needs a non-empty bottom_mlp ending in "
        "the "
        "embedding dim."
      )
    regularizer = model_layers.l2_regularizer(l2_regularization)
    self._bottom_sizes = tuple(bottom_mlp)
    self.bottom_mlp = (
      model_layers.mlp(
        bottom_mlp, kernel_regularizer=regularizer, name="bottom_mlp"
      )
      if num_dense
      else None
    )
    self.interaction = model_layers.DotInteraction(
      self_interaction=self_interaction, name="dot_interaction"
    )
    self.top_mlp = model_layers.mlp(
      tuple(top_mlp) + (1,),
      final_activation=None,
      kernel_regularizer=regularizer,
      name="top_mlp",
    )

  @tf.autograph.experimental.do_not_convert
  def _check_dims(self, vectors: list) -> None:
    dims = {name: v.shape[-1] for name, v in zip(self.feature_names, vectors)}
    distinct = sorted({d for d in dims.values()})
    if len(distinct) > 1:
      by_dim = {d: [n for n, dd in dims.items() if dd == d] for d in distinct}
      raise EmbeddingDimError(
        "DLRM: dot interaction needs one embedding dim for all features; got "
        + "; ".join(f"dim {d}: {names}" for d, names in by_dim.items())
        + ". Give every table the same dim, or use DCNv2."
      )
    if self.bottom_mlp is not None and self._bottom_sizes[-1] != distinct[0]:
      raise EmbeddingDimError(
        f"DLRM: bottom_mlp={self._bottom_sizes} ends in "
        f"{self._bottom_sizes[-1]} but "
        f"the embedding dim is {distinct[0]}; the last bottom_mlp size must "
        "equal it."
      )

  @tf.autograph.experimental.do_not_convert
  def logits(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Raises EmbeddingDimError: unequal embedding dims or bottom MLP width."""
    vectors = self._vectors(activations, self.feature_names)
    self._check_dims(vectors)
    dense = model_layers.dense_input(features, self.num_dense, "DLRM")
    head = []
    if dense is not None:
      assert self.bottom_mlp is not None  # num_dense > 0 requires one
      bottom = self.bottom_mlp(dense, training=training)  # [B, D]
      vectors = [bottom] + vectors
      head = [bottom]
    interactions = self.interaction(vectors)  # [B, F(F-1)/2] or [B, F(F+1)/2]
    top_input = tf.concat(head + [interactions], axis=-1)
    return tf.squeeze(self.top_mlp(top_input, training=training), axis=-1)
