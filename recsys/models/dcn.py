"""DCN-v2: `tfrs.layers.dcn.Cross` layers and a deep tower, stacked or parallel.

Wang et al., "DCN V2: Improved Deep & Cross Network and Practical Lessons for
Web-scale Learning to Rank Systems" (2020), https://arxiv.org/abs/2008.13535.
"""

from collections.abc import Mapping, Sequence
from typing import Annotated

import gin
import tensorflow as tf
import tensorflow_recommenders as tfrs

from recsys import ranges
from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import layers as model_layers
from recsys.models.base import AucThresholds, Objective, RankingModel
from recsys.models.layers import Pooling

STRUCTURES = ("stacked", "parallel")


@gin.register
class DCNv2(RankingModel):
  """DCN-v2 ranking model.

  x0 = concat(features["dense"], every categorical activation) `[B, d0]`
  (activations may have different dims; sequence features are pooled).

  - "stacked":  x0 -> cross network -> deep MLP -> logit.
  - "parallel": concat(cross network(x0), deep MLP(x0)) -> logit.

  The cross network is `num_cross_layers` `tfrs.layers.dcn.Cross` layers,
  x_{l+1} = x0 * (W x_l + b) + x_l, with W full-rank or, with
  `projection_dim`, low-rank U V (U: d0 x r, V: r x d0).

  Example:
    >>> specs = [FeatureSpec("user", 23), FeatureSpec("item", 29)]
    >>> model = DCNv2(specs, num_dense=3, num_cross_layers=2, deep_mlp=(16,))
    >>> acts = {"user": tf.zeros([5, 7]), "item": tf.zeros([5, 11])}
    >>> model(acts, {"dense": tf.zeros([5, 3])}).shape
    TensorShape([5])
  """

  @ranges.checked
  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    num_dense: ranges.NonNegativeInt = 0,
    num_cross_layers: ranges.PositiveInt = 3,
    projection_dim: ranges.PositiveInt | None = None,
    use_bias: ranges.Flag = True,
    diag_scale: ranges.NonNegative = 0.0,
    structure: Annotated[str, ranges.Choice(STRUCTURES)] = "stacked",
    deep_mlp: ranges.LayerSizes = (64, 32),
    objective: Objective = "binary",
    sequence_pooling: Pooling = "mean",
    l2_regularization: ranges.NonNegative = 0.0,
    auc_num_thresholds: AucThresholds = 1000,
    name: ranges.Name | None = "dcn_v2",
  ) -> None:
    """Builds the layers (their variables are created on the first call).

    Args:
      feature_specs: the data source's categorical features (model order).
      num_dense: width of `features["dense"]` (0: none).
      num_cross_layers: number of Cross layers (>= 1).
      projection_dim: rank r of the low-rank cross kernel (None: full rank).
      use_bias: bias in each Cross layer.
      diag_scale: added to the diagonal of each cross kernel (>= 0).
      structure: "stacked" or "parallel".
      deep_mlp: hidden sizes of the deep tower (ReLU; may be empty); a linear
        layer of width 1 gives the logit.
      l2_regularization: L2 factor on every kernel (0: none).
      objective, sequence_pooling, auc_num_thresholds, name: `RankingModel`'s.

    Raises:
      SettingRangeError: a setting outside its declared range (the
        annotations: `recsys.ranges`).
      ModelConfigError: what the model's base class refuses.
    """
    super().__init__(
      feature_specs,
      num_dense=num_dense,
      objective=objective,
      sequence_pooling=sequence_pooling,
      auc_num_thresholds=auc_num_thresholds,
      name=name,
    )
    self._structure = structure
    regularizer = model_layers.l2_regularizer(l2_regularization)
    self.cross_layers = [
      tfrs.layers.dcn.Cross(
        projection_dim=projection_dim,
        use_bias=use_bias,
        diag_scale=diag_scale,
        kernel_regularizer=regularizer,
        name=f"cross_{i}",
      )
      for i in range(num_cross_layers)
    ]
    self.deep_mlp = model_layers.mlp(
      deep_mlp, kernel_regularizer=regularizer, name="deep_mlp"
    )
    self.logit_layer = keras.layers.Dense(
      1, kernel_regularizer=regularizer, name="logit"
    )

  @property
  def structure(self) -> str:
    return self._structure

  @tf.autograph.experimental.do_not_convert
  def cross_network(self, x0: tf.Tensor) -> tf.Tensor:
    """The cross network `[B, d0] -> [B, d0]`."""
    x = x0
    for layer in self.cross_layers:
      x = layer(x0, x)
    return x

  @tf.autograph.experimental.do_not_convert
  def logits(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """The features' activation dims may differ (x0 is their concat)."""
    vectors = self._vectors(activations, self.feature_names)
    dense = model_layers.dense_input(features, self.num_dense, "DCNv2")
    parts = ([dense] if dense is not None else []) + vectors
    # One dtype: a mixed policy's compute dtype (the dense input is float32).
    x0 = tf.concat(
      [tf.cast(p, self.compute_dtype) for p in parts], axis=-1
    )  # [B, d0]
    if self._structure == "stacked":
      top = self.deep_mlp(self.cross_network(x0), training=training)
    else:
      top = tf.concat(
        [self.cross_network(x0), self.deep_mlp(x0, training=training)], axis=-1
      )
    return tf.squeeze(self.logit_layer(top), axis=-1)
