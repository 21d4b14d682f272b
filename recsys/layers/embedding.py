"""`Embedding`: a Keras layer over any embedding backend, trained inside `fit`.

A drop-in for `tfrs.layers.embedding.TPUEmbedding`: the same constructor
(`feature_config`, `optimizer`, `pipeline_execution_with_tensor_core`,
`batch_size`, ...) and call (`layer(features, weights)` -> activations shaped
like `feature_config`), but it runs on every backend of `backends` ("auto":
the one `backends.create` picks for the strategy in scope, logged with its
reason) and trains the tables with the layer's embedding optimizer — the TPU
optimizer math — on CPU, GPU and TPU alike. Inside any `tf.keras.Model` or
`tfrs.Model`, `compile(optimizer=...)` + `fit()` trains the tables with the
embedding optimizer and every other variable with the Keras optimizer
(`recsys.layers.gradient_trap`), under the default strategy,
`MirroredStrategy`, `MultiWorkerMirroredStrategy` (tensorcore backend) and
`ParameterServerStrategy` (sharded backend, steps scheduled by Keras on the
workers); under a `TPUStrategy` the backend is the TPU's (dispatch tested
on CPU only: no TPU here).

Checkpoints: the layer's `embedding` attribute is the backend, whose
variables are `<table>` and `<table>.S<slot>` (TF's mid-level API names), so
`tf.train.Checkpoint(embedding=layer.embedding)` is interchangeable with the
Trainer's checkpoints (`embedding=` node) and TF's
`TPUEmbeddingForServing`; `model.save_weights` holds them under the layer.

SavedModels: outside a training step the lookup is plain TF ops on the
tables, so `tf.saved_model.save` of a model with the layer serves without
this project installed.

Example:
  >>> from recsys import layers
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="movies")
  >>> emb = layers.Embedding(
  ...     {"movie": tf.tpu.experimental.embedding.FeatureConfig(table)},
  ...     optimizer=tf.tpu.experimental.embedding.Adagrad(0.1))
  >>> inputs = {"movie": keras.Input([], dtype=tf.int64, name="movie")}
  >>> out = keras.layers.Dense(1)(emb(inputs)["movie"])
  >>> model = keras.Model(inputs, out)
  >>> model.compile(optimizer="adam", loss="mse")
  >>> model.fit(dataset)  # tables: Adagrad with TPU math; Dense: Adam
"""

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import
from tensorflow.tpu.experimental import embedding

import backends
from backends import base
from recsys._keras import keras, tf
from recsys.layers import gradient_trap

log = logging.getLogger("recsys.layers")


# String names TFRS's layer accepts for an optimizer, with TF's defaults.
_OPTIMIZER_NAMES = {
  "sgd": embedding.SGD,
  "adagrad": embedding.Adagrad,
  "adam": embedding.Adam,
  "ftrl": embedding.FTRL,
}


def embedding_optimizer(optimizer: Any) -> Any:
  """A `tf.tpu.experimental.embedding` optimizer from what TFRS accepts.

  Args:
    optimizer: an instance of `tf.tpu.experimental.embedding.SGD`, `Adagrad`,
      `AdagradMomentum`, `Adam` or `FTRL`; a name ("sgd", "adagrad", "adam",
      "ftrl": TF's default hyper-parameters); or None (every table names its
      own optimizer, or the layer is lookup-only).

  Raises:
    ValueError: an unknown name, or a Keras optimizer (whose math differs:
      e.g. Keras's Adagrad adds an epsilon, the TPU's does not).
  """
  if optimizer is None or isinstance(optimizer, base.OPTIMIZER_CLASSES):
    return optimizer
  if isinstance(optimizer, str):
    if optimizer.lower() not in _OPTIMIZER_NAMES:
      raise ValueError(
        f"unknown embedding optimizer name {optimizer!r}; use "
        f"one of {sorted(_OPTIMIZER_NAMES)} or an instance of "
        "a tf.tpu.experimental.embedding optimizer."
      )
    return _OPTIMIZER_NAMES[optimizer.lower()]()
  if isinstance(
    optimizer, (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
  ):
    raise ValueError(
      f"optimizer is a Keras {type(optimizer).__name__}; the embedding "
      "tables are trained with TPU optimizer math: pass e.g. "
      "tf.tpu.experimental.embedding.Adagrad(learning_rate=0.1) (the Keras "
      "optimizer of compile() trains the other variables)."
    )
  raise ValueError(
    f"optimizer is a {type(optimizer).__name__}; expected a "
    "tf.tpu.experimental.embedding optimizer (SGD, Adagrad, "
    "AdagradMomentum, Adam, FTRL), one of their names, or None."
  )


class Embedding(keras.layers.Layer):
  """Embedding lookups on any backend, tables trained by `fit`.

  Args:
    feature_config: nested structure of
      `tf.tpu.experimental.embedding.FeatureConfig`.
    optimizer: the default embedding optimizer for tables without one (see
      `embedding_optimizer` for what is accepted).
    pipeline_execution_with_tensor_core: passed to the TPU embedding engine
      (tpu_embedding backend); ignored elsewhere, as there is no pipelining.
    batch_size: the per-replica batch size (TFRS's deprecated argument): the
      tpu_embedding backend builds with it; others need no batch size.
    embedding_feature: TFRS's override of the TPU's embedding feature: only
      `UNSUPPORTED` is accepted, meaning backend="tensorcore".
    sparse_core_embedding_config: passed to SparseCore (tpu_embedding V2).
    backend: "auto" (default: chosen from the strategy in scope when the layer
      is constructed, like TFRS's layer) or a backend name.
    strategy: the strategy to build and run under (default: the one in scope
      when the layer is constructed).
    backend_options: extra keyword arguments of the backend's constructor
      (e.g. `bag_widths`, `invalid_ids`).
    **kwargs: Keras `Layer` arguments (`name`, ...).

  Call args:
    features: structure of `feature_config` with int ids (dense, `SparseTensor`
      or `RaggedTensor`).
    weights: None or the same structure of per-id weights.
    training: Keras's flag; True inside `fit` (lookups whose gradients the
      trap applies), False in `evaluate`/`predict`/serving.

  Returns:
    Activations shaped like `feature_config` (`[B, D]`, `[B, L, D]` for
    sequence features).
  """

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any = None,
    pipeline_execution_with_tensor_core: bool = False,
    batch_size: int | None = None,
    embedding_feature: Any | None = None,
    sparse_core_embedding_config: Any | None = None,
    *,
    backend: str = "auto",
    backend_options: Mapping[str, Any] | None = None,
    strategy: tf.distribute.Strategy | None = None,
    **kwargs: Any,
  ):
    super().__init__(**kwargs)
    if embedding_feature is not None:
      unsupported = (
        tf.tpu.experimental.HardwareFeature.EmbeddingFeature.UNSUPPORTED
      )
      if embedding_feature != unsupported:
        raise ValueError(
          f"embedding_feature={embedding_feature!r}: only UNSUPPORTED (run "
          "the tables on the TensorCore) can be forced; the accelerator "
          "version is read from the TPU. Or pass backend=<name>."
        )
      if backend not in ("auto", "tensorcore"):
        raise ValueError(
          f"embedding_feature=UNSUPPORTED means backend "
          f"'tensorcore', but backend={backend!r} was given."
        )
      backend = "tensorcore"
    name, _ = backends.registry.resolve(backend, strategy)
    cls = backends.get(name)
    accepted = inspect.signature(cls.__init__).parameters
    options: dict[str, Any] = {}
    for key, value in (
      (
        "pipeline_execution_with_tensor_core",
        pipeline_execution_with_tensor_core,
      ),
      ("per_replica_batch_size", batch_size),
      ("sparse_core_embedding_config", sparse_core_embedding_config),
    ):
      if key in accepted and value not in (None, False):
        options[key] = value
    options.update(backend_options or {})
    # strategy None: the backend takes the strategy in scope.
    self.embedding = cls(
      feature_config,
      embedding_optimizer(optimizer),
      strategy=strategy,
      **options,
    )
    self.backend_name = name
    self.batch_size = batch_size
    self._trains = self.embedding.capabilities.trains
    self._trap_variable = None

  @property
  def feature_config(self) -> Any:
    return self.embedding.feature_config

  @property
  def embedding_tables(self) -> dict[Any, tf.Variable]:
    """The table variables, keyed by `TableConfig`."""
    return self.embedding.embedding_tables

  def build(self, input_shape: Any) -> None:
    with tf.init_scope():
      self.embedding.build()
    if self._trains:
      # One trainable float: the gradient trap's anchor (value unused).
      self._trap_variable = self.add_weight(
        name="embedding_gradient_trap",
        shape=(1,),
        dtype=tf.float32,
        initializer="zeros",
        trainable=True,
      )
    super().build(input_shape)

  def call(
    self,
    features: Any,
    weights: Any | None = None,
    training: bool | None = None,
  ) -> Any:
    # A training lookup only where a tape can take its gradients (fit's
    # train_step) and will (the layer is trainable, so Keras differentiates
    # the trap's anchor): `model(x, training=True)` outside a tape, or a
    # frozen layer, must not leave a lookup whose gradients never come.
    if not (
      training
      and self._trains
      and self.trainable
      and record.could_possibly_record()
    ):
      return self.embedding.lookup(features, weights, training=False)
    activations = self.embedding.lookup(features, weights, training=True)
    flat = nest.flatten(activations)
    structure = self.embedding.feature_config

    def apply(flat_gradients):
      self.embedding.apply_gradients(
        nest.pack_sequence_as(structure, flat_gradients)
      )

    return nest.pack_sequence_as(
      structure, gradient_trap.trap(flat, self._trap_variable, apply)
    )

  def get_config(self) -> dict[str, Any]:
    raise NotImplementedError(
      "Embedding holds TableConfig objects and cannot be rebuilt from a "
      "config: save weights or checkpoints, or a SavedModel for serving."
    )
