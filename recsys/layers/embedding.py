"""`Embedding`: a Keras layer over any embedding backend, trained inside `fit`.

A drop-in for `tfrs.layers.embedding.TPUEmbedding`: the same constructor
(`feature_config`, `optimizer`, `pipeline_execution_with_tensor_core`,
`batch_size`, `embedding_feature`, `sparse_core_embedding_config`) and call
(`layer(features, weights, serving_config=None)` -> activations shaped like
`feature_config`), but it runs on every backend of `backends` ("auto": the
one `backends.create` picks for the strategy in scope, logged with its
reason) and trains the tables with the embedding optimizer — the TPU
optimizer math — on CPU, GPU and TPU alike.

What TFRS's layer accepts, this one does (docs/keras.md):

* optimizers: a `tf.tpu.experimental.embedding` optimizer, a name, or a
  Keras optimizer (also shared with `compile()`), per layer and per
  `TableConfig.optimizer`, translated by `recsys.layers.keras_optimizers`;
* building wherever Keras builds: at the first call inside `fit`'s replica
  step (subclassed models, every TFRS tutorial), in `tf.function`,
  functional models and `model.build()`, under every strategy;
* int32, int64 or float ids (whole numbers, as `tf.strings.to_number`
  gives), dense, `SparseTensor` or `RaggedTensor`, per-id `weights`, and
  `serving_config` for a CPU lookup on other feature configs;
* training in `fit`, and in custom loops that apply a Keras optimizer to
  `model.trainable_variables` (the gradient trap, `gradient_trap`): a
  lookup trains when a tape records it and `training` is not False, and the
  tables move only when a gradient request covers the layer's weights.

Checkpoints: the layer's `embedding` attribute is the backend, whose
variables are `<table>` and `<table>.S<slot>` (TF's mid-level API names), so
`tf.train.Checkpoint(embedding=layer.embedding)` is interchangeable with the
Trainer's checkpoints (`embedding=` node) and TF's
`TPUEmbeddingForServing`; `model.save_weights` and `tf.train.Checkpoint(
model=model)` hold them under the layer.

SavedModels: outside a training step the lookup is plain TF ops on the
tables, so a SavedModel of a model with the layer serves without this
project installed. Such a model, loaded back (`tf.keras.models.load_model`),
cannot train its tables: it refuses to, with an error that says how to
restore the weights into a model built in Python, which can.

Example:
  >>> from recsys import layers
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="movies")
  >>> emb = layers.Embedding(
  ...     {"movie": tf.tpu.experimental.embedding.FeatureConfig(table)},
  ...     optimizer=tf.keras.optimizers.Adagrad(0.1))
  >>> inputs = {"movie": keras.Input([], dtype=tf.int64, name="movie")}
  >>> out = keras.layers.Dense(1)(emb(inputs)["movie"])
  >>> model = keras.Model(inputs, out)
  >>> model.compile(optimizer="adam", loss="mse")
  >>> model.fit(dataset)  # tables: Adagrad with TPU math; Dense: Adam
"""

import copy
import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import backends
from backends import base
from backends.pending import UnappliedGradientsError
from recsys import _tf_internal, planning
from recsys._keras import keras, tf
from recsys.errors import RecsysError
from recsys.layers import gradient_trap, keras_optimizers, loss_scaling
from recsys.layers.ids import integer_ids

log = logging.getLogger("recsys.layers")

#: Raised by the gradient of a lookup in a model loaded from a SavedModel.
RELOADED_MODEL_CANNOT_TRAIN = (
  "this model was loaded from a SavedModel, whose embedding tables cannot "
  "train: the saved graph has the lookups but not the embedding optimizer. "
  "Build the model in Python (the same code, with recsys.layers.Embedding) "
  "and restore the saved weights into it: "
  "model.load_weights('<saved_model_dir>/variables/variables'). That model "
  "trains its tables."
)


class EmbeddingCalledTwiceError(UnappliedGradientsError, RecsysError):
  """The layer was called for training again before its last call's
  gradient arrived: twice in one training step, as a rule."""

  # AutoGraph re-raises an error from a traced step with its own type only
  # if the type's __init__ is Exception's (as the base's is).
  __init__ = Exception.__init__


def embedding_optimizer(
  optimizer: Any, ignore_unsupported_optimizer_settings: bool = False
) -> Any:
  """A `tf.tpu.experimental.embedding` optimizer from what TFRS accepts.

  Args:
    optimizer: an instance of `tf.tpu.experimental.embedding.SGD`, `Adagrad`,
      `AdagradMomentum`, `Adam` or `FTRL`; a name ("sgd", "adagrad", "adam",
      "ftrl": TF's default hyper-parameters); a Keras SGD, Adagrad, Adam,
      AdamW or Ftrl (translated: `recsys.layers.keras_optimizers`); or None
      (every table names its own optimizer, or the layer is lookup-only).
    ignore_unsupported_optimizer_settings: as `Embedding`'s.

  Raises:
    ValueError: an unknown name, an optimizer with no embedding
      counterpart, or a Keras setting the tables cannot take.
  """
  return keras_optimizers.translate(
    optimizer, ignore_unsupported_optimizer_settings
  ).optimizer


# Registered under "recsys>Embedding": Keras's saving then does not mistake
# it for its own `Embedding` layer.
@keras.saving.register_keras_serializable(package="recsys")
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
      (e.g. `bag_widths`, `invalid_ids`); a table's layout is `placement`'s.
    placement: a `recsys.planning.EmbeddingPlacement`: the tables' layout
      requests (`tables`, `row_layout`, `exchange`, `exchange_sigmas`,
      `table_dtype`) and a device's memory. The layer plans its tables as a
      run does (`recsys.planning.plan_memory`) and builds the backend from
      the plan's layouts (`layer.embedding.layouts()`). None: the defaults
      (each table replicated while the tables fit, float32).
    ignore_unsupported_optimizer_settings: a Keras optimizer (the layer's or
      a `TableConfig`'s) with a setting the embedding optimizer cannot apply
      (SGD `momentum`, Adam `amsgrad`, `clipnorm`, `global_clipnorm`, ...)
      is refused, as TFRS's layer refuses it; True trains the tables
      without it, logged once per table.
    **kwargs: Keras `Layer` arguments (`name`, ...).

  Call args:
    features: structure of `feature_config` with ids (int or whole-number
      float; dense, `SparseTensor` or `RaggedTensor`).
    weights: None or the same structure of per-id weights.
    training: Keras's flag. A lookup trains (its gradients reach the
      embedding optimizer) when a `tf.GradientTape` records it and
      `training` is not False: in `fit`, and in custom loops, as with TFRS's
      layer. False: `evaluate`, `predict`, serving.
    serving_config: None, or a structure of `FeatureConfig`s over this
      layer's tables (by object or name): a plain CPU lookup on them, as
      TFRS's `serving_config`.

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
    ignore_unsupported_optimizer_settings: bool = False,
    placement: planning.EmbeddingPlacement | None = None,
    **kwargs: Any,
  ):
    # Float ids must reach `call` as they are, not cast to float32 by Keras.
    kwargs.setdefault("autocast", False)
    super().__init__(**kwargs)
    backend = _backend_for_embedding_feature(embedding_feature, backend)
    planning.refuse_layout_options(
      backend_options, "backend_options", "the layer's placement="
    )
    name, _ = backends.registry.resolve(backend, strategy)
    offered = {
      "pipeline_execution_with_tensor_core": (
        pipeline_execution_with_tensor_core
      ),
      "per_replica_batch_size": batch_size,
      "sparse_core_embedding_config": sparse_core_embedding_config,
    }
    options = backends.registry.declared_options(
      name, {k: v for k, v in offered.items() if v not in (None, False)}
    )
    options.update(backend_options or {})
    ignore = ignore_unsupported_optimizer_settings
    default = _translated(optimizer, ignore, "optimizer")
    backend_config, tables, translations = _translate_table_optimizers(
      feature_config, ignore
    )
    self._user_feature_config = feature_config
    # backend's TableConfig (a copy where its optimizer was translated) ->
    # the one the user gave, by id.
    self._user_tables = tables
    # The same planner as a run: the backend is built from its layouts.
    plan = planning.plan_memory(
      backend_config,
      default.optimizer,
      strategy,
      backend=name,
      placement=placement or planning.EmbeddingPlacement(),
    )
    # strategy None: the backend takes the strategy in scope.
    # Any: a backend may take more than the base class's arguments (apply_if).
    self.embedding: Any = backends.registry.construct(
      name,
      backend_config,
      default.optimizer,
      strategy,
      plan.layouts(),
      **options,
    )
    self.backend_name = name
    self.batch_size = batch_size
    self._trains = self.embedding.capabilities.trains
    self._trap_variable = None
    self._warned_untrained_call = False
    self._warned_unseen_scaler = False
    # Replica thread -> the trace of its last training call (a weak
    # reference; None: eager), to tell a second call in one step.
    self._training_calls: dict[int, Any] = _tf_internal.NoDependency({})
    # Keras schedules the layer advances (keras_optimizers.ScheduleStep);
    # kept out of Keras's attribute tracking: their counts are weights.
    self._schedule_steps = _tf_internal.NoDependency(
      [
        t.schedule_step
        for t in (default, *translations.values())
        if t.schedule_step is not None
      ]
    )
    _log_translations(self.embedding, default, tables, translations)

  @property
  def feature_config(self) -> Any:
    """The feature configuration as given (TFRS's layer keeps it too)."""
    return self._user_feature_config

  @property
  def embedding_tables(self) -> dict[Any, tf.Variable]:
    """The table variables, keyed by the `TableConfig`s as given."""
    return {
      self._user_tables.get(id(table), table): var
      for table, var in self.embedding.embedding_tables.items()
    }

  def build(self, input_shape: Any) -> None:
    # From inside fit's replica step too: the backend builds once, in
    # cross-replica context (base.cross_replica_build).
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
      # The steps this layer applied, per Keras schedule it reads
      # (checkpointed: a resumed fit continues the schedule).
      for i, steps in enumerate(self._schedule_steps):
        steps.count = self.add_weight(
          name="keras_schedule_step" + (f"_{i}" if i else ""),
          shape=(),
          dtype=tf.int64,
          initializer="zeros",
          trainable=False,
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    super().build(input_shape)

  def call(
    self,
    features: Any,
    weights: Any | None = None,
    training: bool | None = None,
    serving_config: Any | None = None,
  ) -> Any:
    if serving_config is not None:
      return self._serving_lookup(features, weights, serving_config)
    features = self._integer_ids(features, self.embedding.feature_config)
    if _tf_internal.in_saved_model_trace():
      return self._saved_lookup(features, weights)
    trains = training is not False and self._trains and self.trainable
    # Dynamic-vocabulary tables: raw ids made rows; a training call's
    # mapping admits and evicts (once for every replica's ids).
    features = self.embedding.map_ids(
      features, training=trains and _tf_internal.tape_is_recording()
    )
    if not trains:
      return self._in_compute_dtype(
        self.embedding.lookup(features, weights, training=False)
      )
    if not _tf_internal.tape_is_recording():
      # Nothing can differentiate this lookup: leave nothing waiting.
      if training:
        self._warn_untrained_call()
      return self._in_compute_dtype(
        self.embedding.lookup(features, weights, training=False)
      )
    try:
      activations = self.embedding.lookup(features, weights, training=True)
    except UnappliedGradientsError as error:
      raise self._called_twice_error() from error
    trace = _trace_or_none()
    self._training_calls[threading.get_ident()] = (
      None if trace is None else weakref.ref(trace)
    )
    flat = tf.nest.flatten(activations)
    structure = self.embedding.feature_config

    def apply(flat_gradients, finite):
      gradients = tf.nest.pack_sequence_as(structure, flat_gradients)
      if finite is None:
        self._warn_float16_without_loss_scaler()
        self.embedding.apply_gradients(gradients)
      else:  # Keras's loss scaling: a non-finite step leaves the tables
        loss_scaling.check_can_skip(self.embedding, self.name)
        self.embedding.apply_gradients(gradients, apply_if=finite)
      for steps in self._schedule_steps:
        steps.advance()  # a step the loss scaler skipped counts, as in Keras

    def not_requested(persistent: bool) -> None:
      # The caller asked for other variables only: the tables stay. A tape
      # that cannot be asked again drops the lookup.
      if not persistent:
        self.embedding.abandon_training_lookup()

    return self._in_compute_dtype(
      tf.nest.pack_sequence_as(
        structure,
        gradient_trap.trap(flat, self._trap_variable, apply, not_requested),
      )
    )

  def _in_compute_dtype(self, activations: Any) -> Any:
    """Activations in the layer's compute dtype, as Keras's own `Embedding`
    returns them: float16 / bfloat16 under a mixed policy. The tables and
    their optimizer stay float32; the trap sees float32 gradients."""
    dtype = tf.as_dtype(self.compute_dtype or tf.float32)
    return tf.nest.map_structure(
      lambda a: a if a.dtype == dtype else tf.cast(a, dtype), activations
    )

  def _integer_ids(self, features: Any, feature_config: Any) -> Any:
    """`features` with float ids cast to int64 after checks (`ids`)."""
    try:
      paths = _tf_internal.flatten_with_joined_string_paths(feature_config)
      flat = _tf_internal.flatten_up_to(feature_config, features)
    except (ValueError, TypeError):
      return features  # the backend names what does not match
    converted = [
      integer_ids(ids, f"feature {path!r} (table {feature.table.name!r})")
      for (path, feature), ids in zip(paths, flat)
    ]
    return tf.nest.pack_sequence_as(feature_config, converted)

  def _saved_lookup(self, features: Any, weights: Any | None) -> Any:
    """A lookup traced for a SavedModel: serves, and refuses to train.

    A model loaded back from the SavedModel runs these traces: the tables'
    gradient would reach nothing, so `fit` on it would train the dense
    layers and silently leave the tables. `PreventGradient` (a core op;
    an identity forward) makes that an error that says what to do.
    """
    activations = self._in_compute_dtype(
      self.embedding.lookup(features, weights, training=False)
    )
    return tf.nest.map_structure(
      lambda act: tf.raw_ops.PreventGradient(
        input=act, message=RELOADED_MODEL_CANNOT_TRAIN
      ),
      activations,
    )

  def _serving_lookup(
    self, features: Any, weights: Any | None, serving_config: Any
  ) -> Any:
    """TFRS's `serving_config`: a CPU lookup of other features on the
    tables (matched by `TableConfig` object, else by name)."""
    by_object = {id(t): v for t, v in self.embedding_tables.items()}
    by_name = {
      self.embedding.table_name(t): v
      for t, v in self.embedding.embedding_tables.items()
    }
    tables = {}
    for path, feature in _tf_internal.flatten_with_joined_string_paths(
      serving_config
    ):
      table = feature.table
      var = by_object.get(id(table), by_name.get(table.name))
      if var is None:
        raise ValueError(
          f"serving_config[{path!r}] uses table {table.name!r}, which this "
          f"layer does not have; its tables are {sorted(by_name)}."
        )
      tables[table] = var
    features = self._integer_ids(features, serving_config)
    return self._in_compute_dtype(
      tf.tpu.experimental.embedding.serving_embedding_lookup(
        features, weights, tables, serving_config
      )
    )

  def _called_twice_error(self) -> EmbeddingCalledTwiceError:
    """What a training call says when the previous one is still waiting
    for its gradient (the backend refused the lookup)."""
    reference = self._training_calls.pop(threading.get_ident(), None)
    previous = None if reference is None else reference()
    trace = _trace_or_none()
    fix = (
      "The layer is looked up once per training step: its tables' update "
      "is applied from that call's gradient. Look every feature up in one "
      "call (one dict with all of them; features can share a table through "
      "their FeatureConfig), or give each call its own layer; a call that "
      "needs no training takes training=False."
    )
    if trace is not None and previous is trace:
      return EmbeddingCalledTwiceError(
        f"embedding layer {self.name!r} was called twice for training in "
        f"one step (while tracing {getattr(trace, 'name', 'a step')!r}). "
        f"{fix}"
      )
    return EmbeddingCalledTwiceError(
      f"embedding layer {self.name!r} was called for training again "
      "before the gradient of its previous training call reached it: "
      "either it is called twice in one training step, or that earlier "
      "call's gradient was never taken (the tables train when the loss "
      "uses its activations and its gradient is taken over the model's "
      f"trainable variables, as fit does). {fix}"
    )

  def _warn_untrained_call(self) -> None:
    if self._warned_untrained_call or _tf_internal.in_saved_model_trace():
      return
    self._warned_untrained_call = True
    log.warning(
      "embedding layer %r was called with training=True outside any "
      "tf.GradientTape: nothing can take the lookup's gradients, so it does "
      "not train the tables (it is an ordinary lookup). Tables train when a "
      "tape records the call and its gradient is taken over the model's "
      "trainable variables (fit does this).",
      self.name,
    )

  def _warn_float16_without_loss_scaler(self) -> None:
    """float16 without a loss scaler in sight: a loss scaled by hand in a
    custom loop would reach the tables scaled, and nothing can tell."""
    if self._warned_unseen_scaler or self.compute_dtype != "float16":
      return
    self._warned_unseen_scaler = True
    log.warning(
      "embedding layer %r computes in float16, but its gradient was not "
      "taken by a Keras LossScaleOptimizer (its minimize or "
      "compute_gradients) nor in a model's train_step whose optimizer is "
      "one: the tables take the gradient as it comes. If this loss was "
      "scaled by hand (get_scaled_loss), the tables' steps are scaled too: "
      "compute the gradients with optimizer.compute_gradients(loss, "
      "variables, tape=tape) instead, which the layer sees and unscales.",
      self.name,
    )

  def _checkpoint_adapter(self, path: str) -> Any:
    """`model.load_weights` (any TF restore of a checkpoint holding this
    layer) across `table_dtype`s, as the Trainer's resume: TF's restore
    cannot cast ("expected dtype half does not equal original dtype
    float"), so before it reaches the tables, each one the checkpoint holds
    in another dtype reads it in that dtype and is cast (exact into
    float32, to nearest into bfloat16/float16), and values beyond a narrow
    table's range are refused naming the table, unless the backend option
    `saturate_restores` (`backends.checkpoint.prepare_restore`).

    TF calls this with the checkpoint's path when its restore reaches the
    layer, before the layer's variables; no adapter is returned."""
    if path:
      backends.checkpoint.prepare_restore(path, self.embedding)
    return super()._checkpoint_adapter(path)

  def get_config(self) -> dict[str, Any]:
    raise NotImplementedError(
      "Embedding holds TableConfig objects and cannot be rebuilt from a "
      "config: save weights or checkpoints, or a SavedModel for serving."
    )


class _NotKerasOwnEmbedding(logging.Filter):
  """Drops Keras's save-time warning that `Embedding` shares the name of its
  built-in layer: this class is registered as "recsys>Embedding", which is
  what `load_model` reads, so nothing is confused."""

  def filter(self, record: logging.LogRecord) -> bool:
    args = record.args
    return not (
      isinstance(args, tuple) and len(args) == 3 and args[2] is Embedding
    )


logging.getLogger("absl").addFilter(_NotKerasOwnEmbedding())


def _trace_or_none() -> Any:
  """The graph being traced (a step's `tf.function`), None when eager."""
  if tf.executing_eagerly():
    return None
  return tf.compat.v1.get_default_graph()


def _backend_for_embedding_feature(embedding_feature: Any, backend: str) -> str:
  """TFRS's `embedding_feature` override, as a backend name."""
  if embedding_feature is None:
    return backend
  unsupported = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.UNSUPPORTED
  if embedding_feature != unsupported:
    raise ValueError(
      f"embedding_feature={embedding_feature!r}: only UNSUPPORTED (run "
      "the tables on the TensorCore) can be forced; the accelerator "
      "version is read from the TPU. Or pass backend=<name>."
    )
  on_tensor_cores = backends.registry.on_tensor_cores()
  if backend not in ("auto", on_tensor_cores):
    raise ValueError(
      f"embedding_feature=UNSUPPORTED means backend "
      f"{on_tensor_cores!r}, but backend={backend!r} was given."
    )
  return on_tensor_cores


def _translated(
  optimizer: Any, ignore_unsupported: bool, where: str
) -> keras_optimizers.Translation:
  """`keras_optimizers.translate`, its errors saying which optimizer."""
  try:
    return keras_optimizers.translate(optimizer, ignore_unsupported)
  except keras_optimizers.OptimizerTranslationError as error:
    raise keras_optimizers.OptimizerTranslationError(
      f"{where}: {error}"
    ) from None


def _translate_table_optimizers(
  feature_config: Any, ignore_unsupported: bool
) -> tuple[Any, dict[int, Any], dict[int, keras_optimizers.Translation]]:
  """The feature config with each table's optimizer translated.

  A `TableConfig.optimizer` given as a name or a Keras optimizer is
  translated into a copy of the table (the user's config is not changed);
  features of that table point to the copy.

  Returns:
    (the config for the backend, copy id -> the user's table, user table
    id -> its translation).
  """
  copies: dict[int, Any] = {}
  originals: dict[int, Any] = {}
  translations: dict[int, keras_optimizers.Translation] = {}

  def convert(feature):
    table = feature.table
    if isinstance(table.optimizer, str) or keras_optimizers.is_keras_optimizer(
      table.optimizer
    ):
      if id(table) not in copies:
        translation = _translated(
          table.optimizer,
          ignore_unsupported,
          f"TableConfig {table.name!r}'s optimizer",
        )
        clone = copy.copy(table)
        clone.optimizer = translation.optimizer
        copies[id(table)] = clone
        originals[id(clone)] = table
        translations[id(table)] = translation
      feature = copy.copy(feature)
      feature.table = copies[id(table)]
    return feature

  converted = tf.nest.map_structure(convert, feature_config)
  if not copies:
    return feature_config, {}, {}
  return converted, originals, translations


def _log_translations(
  backend: base.EmbeddingBackend,
  default: keras_optimizers.Translation,
  originals: Mapping[int, Any],
  per_table: Mapping[int, keras_optimizers.Translation],
) -> None:
  """Says once per table which embedding optimizer a Keras one became."""
  for table in backend.tables:
    if id(table) in originals:
      translation = per_table[id(originals[id(table)])]
    elif table.optimizer is None:
      translation = default
    else:
      continue  # the table's own embedding optimizer, as given
    if not translation.translated:
      continue
    name = backend.table_name(table)
    described = keras_optimizers.describe(translation.optimizer)
    log.info(
      "table %r: trained by %s, translated from the %s (TPU optimizer "
      "math, docs/optimizers.md).",
      name,
      described,
      translation.source,
    )
    if translation.not_kept:
      log.warning(
        "table %r: the %s's %s %s not kept by the embedding optimizer %s.",
        name,
        translation.source,
        "; ".join(translation.not_kept),
        "is" if len(translation.not_kept) == 1 else "are",
        described,
      )
