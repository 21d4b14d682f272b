"""Factorization machine with bias columns: biased MF / SVD++ / FM as one model.

Rendle, "Factorization Machines" (ICDM 2010); Koren, "Factorization Meets
the Neighborhood" (KDD 2008) for the implicit user-history term.

Each feature's activation `e_f` `[B, D]` is split: its first `bias_dims`
columns are the feature's per-id bias (summed), the rest `v_f` its factor.
So the embedding table holds biases and factors together, and the
embedding optimizer's weight decay regularizes both, as in classic biased
MF trained by SGD:

  prediction = global_bias + sum_f sum(e_f[:bias_dims])
               + sum over interacting pairs (f, g) of <v_f, v_g>
               [+ MLP(concat(v_f))]

With user_id and item_id this is biased MF; add "user_history" (the user's
training items, sharing the item table) and it is SVD++ with the implicit
term folded into the user side; add side features and it is an FM.
"""

from collections.abc import Mapping, Sequence
from typing import Annotated

import gin
import tensorflow as tf

from recsys import ranges
from recsys._keras import keras
from recsys.feature_spec import FeatureSpec
from recsys.models import layers as model_layers
from recsys.models.base import AucThresholds, Objective, RankingModel
from recsys.models.errors import EmbeddingDimError, ModelConfigError
from recsys.models.layers import Pooling


@gin.register
class FactorizationMachine(RankingModel):
  """Factorization machine with per-id bias columns.

  Example:
    >>> specs = [FeatureSpec("user", 23), FeatureSpec("item", 29)]
    >>> model = FactorizationMachine(specs, objective="mse", global_bias=3.5)
    >>> acts = {"user": tf.zeros([5, 8]), "item": tf.zeros([5, 8])}
    >>> model(acts).shape
    TensorShape([5])
  """

  @ranges.checked
  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    num_dense: ranges.NonNegativeInt = 0,
    user_features: ranges.Names | None = None,
    bias_dims: ranges.NonNegativeInt = 1,
    global_bias: ranges.AnyNumber = 0.0,
    deep_mlp: ranges.LayerSizes = (),
    prediction_range: Annotated[
      Sequence[float] | None, ranges.Each(ranges.Real(), min_len=2, max_len=2)
    ] = None,
    objective: Objective = "mse",
    sequence_pooling: Pooling = "mean",
    l2_regularization: ranges.NonNegative = 0.0,
    auc_num_thresholds: AucThresholds = 1000,
    name: ranges.Name | None = "factorization_machine",
  ) -> None:
    """Builds the layers.

    Args:
      feature_specs: the data source's categorical features.
      num_dense: must be 0 (an FM over categorical features only).
      user_features: None: every pair of features interacts (an FM);
        a list: only pairs of one of these with one of the others (the
        user side times the item side, as in MF / SVD++).
      bias_dims: leading activation columns that are the per-id bias (0:
        no bias terms).
      global_bias: initial value of the trainable global bias (the mean
        training rating is a good start).
      deep_mlp: hidden sizes of an optional MLP over the concatenated
        factors whose scalar output is added (DeepFM); () for none.
      prediction_range: (low, high): clip predictions to it outside
        training (e.g. (1, 5) for ratings); None: never clip.
      l2_regularization: L2 factor on the MLP kernels.
      objective, sequence_pooling, auc_num_thresholds, name: `RankingModel`'s
        (here the objective defaults to "mse": ratings).

    Raises:
      SettingRangeError: a setting outside its declared range.
      ModelConfigError: dense features, unknown user_features, an empty
        prediction_range.
    """
    super().__init__(
      feature_specs,
      num_dense=num_dense,
      objective=objective,
      sequence_pooling=sequence_pooling,
      auc_num_thresholds=auc_num_thresholds,
      name=name,
    )
    if num_dense:
      raise ModelConfigError(
        f"FactorizationMachine: num_dense must be 0, got {num_dense}; "
        "use DCNv2 or DLRM for dense features."
      )
    names = self.feature_names
    if user_features is not None:
      unknown = [n for n in user_features if n not in names]
      if unknown:
        raise ModelConfigError(
          f"FactorizationMachine: user_features {unknown} are not features "
          f"of the source; known: {names}."
        )
      left = [i for i, n in enumerate(names) if n in set(user_features)]
      right = [i for i, n in enumerate(names) if n not in set(user_features)]
      self._pairs = [(i, j) for i in left for j in right]
    else:
      self._pairs = [
        (i, j) for i in range(len(names)) for j in range(i + 1, len(names))
      ]
    self._bias_dims = bias_dims
    self._range = None
    if prediction_range is not None:
      low, high = (float(x) for x in prediction_range)
      if not low < high:
        raise ModelConfigError(
          f"FactorizationMachine: prediction_range must be (low, high) with "
          f"low < high, got {prediction_range!r}."
        )
      self._range = (low, high)
    self.global_bias = self.add_weight(
      name="global_bias",
      shape=[],
      initializer=keras.initializers.Constant(global_bias),
    )
    regularizer = model_layers.l2_regularizer(l2_regularization)
    self.deep = None
    if deep_mlp:
      self.deep = model_layers.mlp(
        tuple(deep_mlp) + (1,),
        final_activation=None,
        kernel_regularizer=regularizer,
        name="deep_mlp",
      )

  def logits(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """Predicted ratings (or click logits) `[B]`.

    Raises:
      EmbeddingDimError: an activation is no wider than bias_dims, or two
        interacting features' factors differ in width.
    """
    vectors = self._vectors(activations, self.feature_names)
    b = self._bias_dims
    for name, v in zip(self.feature_names, vectors):
      if v.shape[-1] is not None and v.shape[-1] <= b:
        raise EmbeddingDimError(
          f"FactorizationMachine: feature {name!r} has dim {v.shape[-1]}, "
          f"needs more than bias_dims={b}."
        )
    factors = [v[:, b:] for v in vectors]
    out = self.global_bias + tf.zeros_like(vectors[0][:, 0])
    if b:
      out += tf.add_n([tf.reduce_sum(v[:, :b], axis=-1) for v in vectors])
    if self._pairs:
      out += tf.add_n(
        [
          tf.reduce_sum(factors[i] * factors[j], axis=-1)
          for i, j in self._pairs
        ]
      )
    if self.deep is not None:
      out += tf.squeeze(
        self.deep(tf.concat(factors, axis=-1), training=training), -1
      )
    if self._range is not None and not training:
      out = tf.clip_by_value(out, *self._range)
    return out
