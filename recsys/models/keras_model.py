"""`KerasRecommender`: a bundled model and its embedding layer, one Keras model.

The bundled models (DLRM, DCN-v2, two-tower) take `(activations, features)`
so the Trainer can drive the embedding backend explicitly. For `compile` +
`fit` on a user's own `tf.data.Dataset`, this wrapper owns a
`recsys.layers.Embedding` and the model: batches are `(features, labels)`
with `features` a dict feature name -> ids (plus "dense" -> `[B, num_dense]`
floats), or the data contract of `recsys.data` (`{"categorical": ...,
"dense": ...}`). The tables train with the layer's embedding optimizer (TPU
math), the model's variables with the Keras optimizer of `compile`; the
loss, regularization and metrics are the model's own (`compute_loss`), so
`fit` computes what the Trainer computes.

Example:
  >>> config = {"user": FeatureConfig(users), "movie": FeatureConfig(movies)}
  >>> model = KerasRecommender.build(DLRM, config, Adagrad(0.05),
  ...                                objective="mse", bottom_mlp=(32, 16))
  >>> model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
  >>> model.fit(dataset.batch(256), epochs=3)
"""

from collections.abc import Callable, Mapping
from typing import Any

from recsys import features as features_lib
from recsys import layers
from recsys._keras import keras, tf
from recsys.models.loss_inputs import LossInputs


class KerasRecommender(keras.Model):
  """An `Embedding` layer feeding a ranking or retrieval model, for `fit`.

  Args:
    model: a `RankingModel` or `RetrievalModel` (e.g. `DLRM(...)`) whose
      feature names are keys of `feature_config`.
    feature_config: dict feature name -> `FeatureConfig`.
    optimizer: the default embedding optimizer (see `recsys.layers.Embedding`).
    backend: "auto" or a backend name.
    backend_options: extra arguments of the backend.
    placement: the tables' layout requests, a
      `recsys.planning.EmbeddingPlacement` (see `recsys.layers.Embedding`).
    name: Keras name.
  """

  def __init__(
    self,
    model: keras.Model,
    feature_config: Mapping[str, Any],
    optimizer: Any = None,
    backend: str = "auto",
    backend_options: Mapping[str, Any] | None = None,
    name: str | None = None,
    placement: Any = None,
  ):
    super().__init__(name=name)
    missing = sorted(set(model.feature_names) - set(feature_config))
    if missing:
      raise ValueError(
        f"the model reads features {missing} that "
        f"feature_config does not have ({sorted(feature_config)})."
      )
    # float32 activations under any dtype policy, as the Trainer gives the
    # bundled models (they compute their interactions in float32).
    self.embedding = layers.Embedding(
      dict(feature_config),
      optimizer,
      backend=backend,
      backend_options=backend_options,
      placement=placement,
      dtype="float32",
    )
    self.model = model
    self._names = list(feature_config)
    # Every variable now (call inside strategy.scope()), so fit, checkpoints
    # and the Keras optimizer see them before the first step.
    if not model.built:
      model.create_variables(features_lib.dims(feature_config))
    self.embedding.build(None)
    self.built = True

  @classmethod
  def build(
    cls,
    model_factory: Callable[..., keras.Model],
    feature_config: Mapping[str, Any],
    optimizer: Any = None,
    num_dense: int = 0,
    backend: str = "auto",
    **model_kwargs: Any,
  ) -> "KerasRecommender":
    """Constructs `model_factory(feature_specs, num_dense, **model_kwargs)` and
    the wrapper, with the specs read from `feature_config` (call it inside
    `strategy.scope()`)."""
    specs = features_lib.specs_from_feature_config(feature_config)
    model = model_factory(
      feature_specs=specs, num_dense=num_dense, **model_kwargs
    )
    return cls(model, feature_config, optimizer, backend=backend)

  def _split(
    self, features: Mapping[str, Any]
  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ids for the layer, the batch in the models' data contract)."""
    if "categorical" in features:
      contract = dict(features)
    else:
      contract = {k: v for k, v in features.items() if k not in self._names}
      contract["categorical"] = {k: features[k] for k in self._names}
    categorical = contract["categorical"]
    missing = [k for k in self._names if k not in categorical]
    if missing:
      raise ValueError(
        f"the batch has no features {missing}; it has {sorted(categorical)}."
      )
    return {k: categorical[k] for k in self._names}, contract

  def call(
    self, features: Mapping[str, Any], training: bool = False
  ) -> tf.Tensor:
    """Predictions `[B]` (probabilities, ratings or affinities)."""
    ids, contract = self._split(features)
    weights = contract.get("weights")
    if weights is not None:
      weights = {k: weights.get(k) for k in self._names}
    acts = self.embedding(ids, weights, training=training)
    return self.model(acts, contract, training=training)

  def _loss(self, data, training: bool) -> tf.Tensor:
    features, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    ids, contract = self._split(features)
    weights = contract.get("weights")
    if weights is not None:
      weights = {k: weights.get(k) for k in self._names}
    acts = self.embedding(ids, weights, training=training)
    compute_metrics = None
    if hasattr(self.model, "corpus_index"):  # hit rates need the corpus
      compute_metrics = not training and self.model.corpus_index.is_indexed
    batch = LossInputs(
      acts,
      contract,
      labels,
      sample_weight=sample_weight,
      compute_metrics=compute_metrics,
    )
    return self.model.compute_loss(batch, training=training)

  def train_step(self, data) -> dict[str, tf.Tensor]:
    with tf.GradientTape() as tape:
      loss = self._loss(data, training=True)
    # As Keras's own train_step: under a LossScaleOptimizer (mixed_float16)
    # the loss is scaled and the gradients unscaled. The embedding layer's
    # gradient trap applies the tables' optimizer in it.
    self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
    return self._results(loss)

  def test_step(self, data) -> dict[str, tf.Tensor]:
    return self._results(self._loss(data, training=False))

  def _results(self, loss: tf.Tensor) -> dict[str, tf.Tensor]:
    replicas = self.distribute_strategy.num_replicas_in_sync
    out = {m.name: m.result() for m in self.model.metrics}
    # compute_loss is per replica (divided by the global batch): Keras
    # averages logged values over replicas, so scale back to the batch mean.
    out["loss"] = loss * tf.cast(replicas, loss.dtype)
    return out

  @property
  def metrics(self):
    return list(self.model.metrics)
