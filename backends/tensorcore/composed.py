"""Backends that own their tables: a storage per table x an engine per step.

`ComposedEmbedding` is the lifecycle every such backend shares (build,
lookup, apply_gradients, input counters, preprocess, V0's API) over two
independent choices:

* where each table's rows live — its storage (`backends.storage`):
  replicated on every replica, row-sharded over the replicas, or
  split over parameter servers, chosen per table by the backend
  (`_make_storage`);
* how a step computes — the engine (`backends.tensorcore.engines`): the dynamic
  one (fused CPU kernels or TF ops) or the static XLA path, chosen per trace.

Every engine runs against every storage, joined by one step type
(`backends.table_step.TableStep`). `tensorcore` (replicated or row-sharded
over the replicas) and `parameter_servers` are this class with
their storages.

Example:
  >>> class MyBackend(ComposedEmbedding):
  ...   name = "mine"
  ...   def _make_storage(self, table):
  ...     return replicated.Replicated(
  ...         table, self.table_name(table), self.optimizer_for(table),
  ...         self.strategy)
"""

import abc
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from backends import _tf_internal, base, gradient_rows, hardware, optimizers
from backends import input_checks as checks_lib
from backends import inputs as inputs_lib
from backends import pending as pending_lib
from backends.input_counters import InputCounters
from backends.storage import narrow
from backends.storage.base import TableStorage, Tracker
from backends.table_step import Features
from backends.tensorcore import kernels
from backends.tensorcore.engines import dynamic, static
from backends.vocabulary import stage as stage_lib
from backends.vocabulary.hashed import HashedIds
from backends.vocabulary.stage import CHECKPOINT_KEY as checkpoint_key

log = logging.getLogger("recsys.backends")

# The backend has no data-dependent Python control flow: AutoGraph need not
# convert it (faster traces), and its errors reach the caller as raised.
_not_converted = tf.autograph.experimental.do_not_convert


class ComposedEmbedding(base.EmbeddingBackend, metaclass=abc.ABCMeta):
  """Owned tables: each in its storage, each step on an engine.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the strategy in scope.
    bag_widths: see `EmbeddingBackend`; `preprocess` pads sparse and ragged
      bags to these widths, which gives compiled steps static shapes (and a
      static-size exchange between replicas).
    invalid_ids: "error" (default), "drop" or "oov": what to do with an id
      outside `[0, vocabulary_size)` (see `backends.inputs.validate`).
      Features with `validate_weights_and_indices=False` are not checked.
    fused_kernels: on CPU-only strategies, run training lookups and updates
      with the fused C++ kernels of `backends.tensorcore.kernels` (built on
      first use; the TF ops when they cannot be). False: always the TF ops.
    static_shapes: run the static engine (`backends.tensorcore.engines.static`)
      that a compiled step needs. None (default): whenever the step is compiled
      (under `tf.function(jit_compile=True)` or a TPUStrategy), and for
      lookups whose table gradients a tape may take on several replicas.
      True: always (what a compiled step computes, also uncompiled, e.g. on
      CPU replicas, whose collectives XLA cannot compile). False: never
      (a compiled step then fails).
  """

  #: Whether lookups count refused and cut ids (per-replica counters).
  _counts_inputs = True

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
    invalid_ids: str = "error",
    fused_kernels: bool = True,
    static_shapes: bool | None = None,
  ):
    super().__init__(feature_config, optimizer, strategy, bag_widths=bag_widths)
    self._use_fused_kernels = bool(fused_kernels)
    if static_shapes not in (None, True, False):
      raise ValueError(
        f"static_shapes={static_shapes!r}; use None, True or False."
      )
    self._static_shapes = static_shapes
    if invalid_ids not in checks_lib.ID_POLICIES:
      raise ValueError(
        f"invalid_ids={invalid_ids!r}; use one of "
        f"{', '.join(checks_lib.ID_POLICIES)}."
      )
    self._invalid_ids = invalid_ids
    self._layouts = [
      checks_lib.FeatureLayout(path, feature, self.table_name(feature.table))
      for path, feature in self._flat_features
    ]
    for table in self._tables:
      opt = self.optimizer_for(table)
      if opt is not None:
        optimizers.check_supported(opt, self.table_name(table))
    self._features = _tf_internal.NoDependency(
      Features(
        self._layouts,
        self._bag_widths,
        invalid_ids,
        [(t, self.table_name(t)) for t in self._tables],
      )
    )
    # Pending training lookups, per replica thread (MirroredStrategy runs
    # each replica's step in its own thread and may interleave them).
    self._pending = _tf_internal.NoDependency(
      pending_lib.PendingLookups(self.name)
    )
    self._storages: dict[str, TableStorage] = _tf_internal.NoDependency({})
    # Narrow tables whose saturated values were warned of (`narrow_counts`).
    self._warned_saturated: set[str] = _tf_internal.NoDependency(set())
    self._counters: InputCounters | None = None
    self._stage: Any = None
    self._kernels: Any = None
    self._dynamic_engine = _tf_internal.NoDependency(
      dynamic.DynamicEngine(self._features)
    )
    self._static_engine = _tf_internal.NoDependency(
      static.StaticEngine(self._features)
    )

  @abc.abstractmethod
  def _make_storage(self, table: Any) -> TableStorage:
    """The storage of `table` (created by `build`)."""

  def _vocabularies(self) -> dict[str, Any]:
    """Dynamic table name -> its `DynamicVocabulary` (none by default)."""
    return {}

  def _take_vocabularies(self, vocabularies: Mapping[str, Any]) -> None:
    """Checks each dynamic table's vocabulary against its rows (before any
    work), and leaves the index's "no row" (-1) of "zeros" tables out of
    their bags."""
    for table in self._tables:
      name = self.table_name(table)
      if name in vocabularies:
        vocabularies[name].check(name, table.vocabulary_size)
    zeros = frozenset(
      name
      for name, vocabulary in vocabularies.items()
      if getattr(vocabulary, "unknown", None) == "zeros"
    )
    if zeros:
      self._drop_negative_ids_of(zeros)

  def _vocabulary_home(self) -> dict[str, Any]:
    """Where the indices live and whether steps map concurrently
    (`VocabularyStage`'s `devices` and `concurrent`): this host's CPU, one
    step at a time, by default."""
    return {}

  def _table_by_name(self, name: str) -> Any:
    return next(t for t in self._tables if self.table_name(t) == name)

  def _drop_negative_ids_of(self, tables: frozenset[str]) -> None:
    """Leaves the negative ids of `tables` out of their bags (dynamic
    tables whose unknown ids read zeros: the index's -1)."""
    self._features = _tf_internal.NoDependency(
      dataclasses.replace(self._features, dropped_tables=tables)
    )
    self._dynamic_engine = _tf_internal.NoDependency(
      dynamic.DynamicEngine(self._features)
    )
    self._static_engine = _tf_internal.NoDependency(
      static.StaticEngine(self._features)
    )

  # -- variables -----------------------------------------------------------

  @base.cross_replica_build
  def build(self) -> None:
    """Creates tables and slots under the backend's strategy (idempotent)."""
    if self._built:
      return
    # Loaded first: the dynamic tables' indices take them (their update op).
    if self._use_fused_kernels and _on_cpu_only(self._strategy):
      self._kernels = kernels.load()
    with tf.init_scope(), self._strategy.scope():
      tracker = Tracker(
        _tf_internal.variable_adder(self),
        lambda name, obj: _tf_internal.track_child(self, obj, name),
      )
      storages = {}
      for table in self._tables:
        storage = self._make_storage(table)
        storage.create(tracker)
        if self._kernels is not None:
          storage.use_fused_ops(self._kernels)
        storages[self.table_name(table)] = storage
      self._storages = _tf_internal.NoDependency(storages)
      vocabularies = self._vocabularies()
      for name, vocabulary in vocabularies.items():
        if not isinstance(vocabulary, HashedIds):  # hashed: never resets
          storages[name].check_resettable()
      if vocabularies:
        self._stage = _tf_internal.NoDependency(
          stage_lib.VocabularyStage(
            {n: (self._table_by_name(n), v) for n, v in vocabularies.items()},
            self.feature_table_names(),
            self._strategy,
            lambda name, rows: self._storages[name].reset_rows(rows),
            fused_ops=self._kernels,
            **self._vocabulary_home(),
          )
        )
        # One child beside the tables (`backends.checkpoint.VOCABULARIES`):
        # `vocabularies/tables/<table>/...` and `vocabularies/step`.
        tracker.add_trackable(checkpoint_key, self._stage.trackable())
      if self._counts_inputs:
        self._counters = _tf_internal.NoDependency(
          InputCounters([layout.path for layout in self._layouts])
        )
      if not (
        hardware.is_tpu(self._strategy)
        or hardware.is_parameter_server(self._strategy)
      ):
        # Per replica: set by a training lookup, cleared by apply_gradients
        # (backends.pending); not checkpointed.
        self._pending.use_runtime_guard(
          tf.Variable(
            0,
            dtype=tf.int32,
            trainable=False,
            name="unapplied_lookup",
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
          )
        )
    if self._kernels is not None:
      self._dynamic_engine = _tf_internal.NoDependency(
        dynamic.DynamicEngine(
          self._features,
          self._kernels,
          len(self._tables) * self._strategy.num_replicas_in_sync,
        )
      )
    self._built = True

  @property
  def embedding_tables(self) -> dict[Any, Any]:
    """The table variables, keyed by `TableConfig` (V0's API).

    A row-sharded table is a `backends.storage.row_sharded.
    RowShardedVariable`: it reads (and converts to a tensor) as the full
    `[vocabulary_size, dim]` table.
    """
    self._maybe_build()
    return {
      t: self._storages[self.table_name(t)].parameters for t in self._tables
    }

  def slot_variables(self) -> dict[str, dict[str, Any]]:
    self._maybe_build()
    return {name: s.slots() for name, s in self._storages.items()}

  def replicated_table_variables(self) -> list[Any]:
    """The built replicated tables' parameters and slots: what checkpoints
    of the Trainer and `backends.checkpoint` write and read by row chunks
    (`backends.storage.row_sharded_checkpoint.row_sliced`)."""
    return [
      variable
      for storage in self._storages.values()
      if storage.placement == "replicated"
      for variable in (storage.parameters, *storage.slots().values())
    ]

  def placements(self) -> dict[str, str]:
    """Where each table's rows live, by table name (see `backends.storage`)."""
    self._maybe_build()
    return {name: s.placement for name, s in self._storages.items()}

  @property
  def engine_names(self) -> tuple[str, str]:
    """The engines of uncompiled and compiled steps: ("fused" or "tf_ops",
    "static")."""
    self._maybe_build()
    return self._dynamic_engine.name, self._static_engine.name

  def input_stats(self) -> dict[str, dict[str, int]]:
    """Counts of invalid (dropped / mapped) and truncated ids per feature."""
    self._maybe_build()
    if self._counters is None:
      return {}
    return self._counters.stats()

  def narrow_counts(self) -> dict[str, int]:
    """Narrow tables (`backends.storage.narrow`) -> the values their updates
    saturated so far in this process (beyond the dtype's largest finite
    value: float16's 65504), summed over the replicas' rows; not
    checkpointed. Warns the first time a table's count is not 0 (naming
    it, the count and the largest magnitude). Every worker calls it
    together (a row-sharded table's count is summed over them)."""
    if not self._built:
      return {}
    out = {}
    for name, storage in self._storages.items():
      saturated = storage.saturated()
      if saturated is None:
        continue
      out[name] = saturated.values
      if saturated.values and name not in self._warned_saturated:
        self._warned_saturated.add(name)
        log.warning(
          "table %r (%s): %d value(s) its updates computed were beyond its "
          "range (+-%g) and were saturated to it, the largest %g. Lower the "
          "learning rate or clip the weights (clip_weight_min/max), or "
          "give the table a dtype of wider range (its layout's dtype, "
          "EmbeddingPlacement.table_dtype: bfloat16 or float32).",
          name,
          saturated.dtype,
          saturated.values,
          narrow.largest_finite(saturated.dtype),
          saturated.largest,
        )
    return out

  # -- host side -------------------------------------------------------------

  def preprocess(
    self, features: Any, weights: Any | None = None
  ) -> tuple[Any, Any | None]:
    """Pads sparse/ragged bags to static `PaddedBags` (run in tf.data).

    Features without a width (no `bag_widths` entry and no
    `max_sequence_length`) and dense ids pass through unchanged. Returns
    `(features, weights)`; a padded feature's weight entry becomes None.
    """
    flat, flat_w, _ = self._flat_inputs(features, weights)
    out: list[Any] = []
    out_w: list[Any] = []
    for layout, inp, w in zip(self._layouts, flat, flat_w):
      width = self._features.width(layout)
      if width and isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
        out.append(
          inputs_lib.pad_bags(
            inp,
            w,
            width,
            checks_lib.describe(layout),
            sequence=bool(layout.sequence_length),
          )
        )
        out_w.append(None)
      else:
        out.append(inp)
        out_w.append(w)
    return self._pack_inputs(out, out_w)

  # -- lookup ------------------------------------------------------------------

  @_not_converted
  def embedding_lookup(self, features: Any, weights: Any | None = None) -> Any:
    """V0's name for a lookup; with gradients through the tables."""
    return self.lookup(features, weights, training=False)

  @_not_converted
  def __call__(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    return self.lookup(features, weights, training=training)

  @_not_converted
  def lookup(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    """Looks up and combines every feature.

    Args:
      features: the structure of `feature_config` holding int ids: dense
        `[B]`/`[B, N]`, `SparseTensor`/`RaggedTensor` `[B, None]`, or
        `PaddedBags` from `preprocess`.
      weights: None or the same structure with float weights (None leaves
        allowed) for sparse/ragged features.
      training: remember what `apply_gradients` needs for this step.

    Returns:
      The structure of `feature_config`: `[B, D]` per non-sequence feature,
      `[B, L, D]` per sequence feature, `output_shape + [D]` when set.
    """
    self._maybe_build()
    engine = (
      self._static_engine
      if self._static_path(training)
      else self._dynamic_engine
    )
    flat, flat_w, counters = self._flat_inputs(features, weights)
    outputs, steps = engine.lookup(
      flat, flat_w, counters, self._storages, training
    )
    if training:
      self._pending.record((engine, steps, outputs), outputs)
    return tf.nest.pack_sequence_as(self._feature_config, outputs)

  def _static_path(self, training: bool) -> bool:
    """Whether this trace takes the static engine (see `static_shapes`)."""
    if self._static_shapes is not None:
      return self._static_shapes
    if _tf_internal.in_xla_context() or hardware.is_tpu(self._strategy):
      return True
    # A tape may take the tables' gradients (V0's loop, a Keras optimizer on
    # `embedding_tables`): several replicas all-reduce them, which needs the
    # same size on every replica.
    return (
      not training
      and self._strategy.num_replicas_in_sync > 1
      and tf.distribute.get_replica_context() is not None
      and _tf_internal.tape_may_record()
    )

  def _flat_inputs(
    self, features: Any, weights: Any | None
  ) -> tuple[list[Any], list[Any], InputCounters | None]:
    """Features and weights flattened in config order, and the counters.

    The counters (invalid, truncated ids) are None when nothing is counted:
    the backend keeps none, or this is no replica of its strategy (they are
    per-replica sums).
    """
    flat = self._flatten_like_config(features, "features")
    flat_w = (
      self._flatten_like_config(weights, "weights")
      if weights is not None
      else [None] * len(flat)
    )
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.strategy is not self._strategy:
      return flat, flat_w, None
    return flat, flat_w, self._counters

  # -- training ----------------------------------------------------------------

  @_not_converted
  def apply_gradients(
    self, activation_gradients: Any, apply_if: tf.Tensor | None = None
  ) -> None:
    """Applies each table's embedding optimizer to the rows this step touched.

    Call in the same step as `lookup(..., training=True)`, with the gradient
    of the loss with respect to its activations (None leaves: no gradient).
    Each touched row's gradient is summed over the global batch; under
    several replicas a replicated table's update is the same on every
    replica, a row-sharded table's is applied by each row's owner only.

    `apply_if`, a scalar bool tensor equal on every replica, leaves the
    tables and slots as they are when False (a loss scaler's skipped step):
    the replicas still exchange the step's rows, outside the condition,
    since a `MirroredStrategy` cannot run its collectives inside one.
    """
    if self.lookup_only:
      raise base.UnsupportedConfigError(
        "this backend was built restore_only (its tables alone, no "
        "optimizer slots: for evaluation or export); it cannot train. "
        "Build it without restore_only to train."
      )
    engine, steps, flat_grads = self._take_pending_step(activation_gradients)
    exchanged: dict[str, list[optimizers.SparseUpdate]] = {}
    for table in self._tables:
      name = self.table_name(table)
      step, storage = steps[name], self._storages[name]
      engine.check_update(name, step, storage)
      if apply_if is not None and storage.update_exchanges():
        exchanged[name] = self._exchanged_updates(
          engine, table, step, flat_grads, storage
        )

    def write() -> tf.Tensor:
      # Tables sharing an optimizer are updated together: one run of its
      # element-wise math over all their touched rows (same numbers).
      groups: dict[int, tuple[Any, list[optimizers.SparseUpdate]]] = {}
      for table in self._tables:
        name = self.table_name(table)
        step, storage = steps[name], self._storages[name]
        opt = self.optimizer_for(table)
        updates = exchanged.get(name)
        if updates is None:
          if engine.apply_in_place(table, step, flat_grads, storage, opt):
            continue
          updates = self._exchanged_updates(
            engine, table, step, flat_grads, storage
          )
        for update in updates:
          groups.setdefault(id(opt), (opt, []))[1].append(update)
      fused = engine.update_kernels()
      for opt, updates in groups.values():
        optimizers.apply_sparse_updates(opt, updates, fused_ops=fused)
      return tf.constant(True)

    if apply_if is None:
      write()
    else:
      tf.cond(apply_if, write, lambda: tf.constant(False))

  def _exchanged_updates(
    self,
    engine: Any,
    table: Any,
    step: Any,
    flat_grads: list[Any],
    storage: Any,
  ) -> list[optimizers.SparseUpdate]:
    """The table's updates from this replica's row gradients; an update
    that exchanges rows between replicas sends only the rows a gradient
    reaches, where that changes no result (`backends.gradient_rows`)."""
    row_grads = engine.row_gradients(table, step, flat_grads)
    if (
      not storage.update_exchanges()
      or not optimizers.zero_gradient_is_identity(self.optimizer_for(table))
    ):
      return storage.updates(step, row_grads)
    reached = engine.reached_rows(step, flat_grads)
    if reached is None or (
      reached.bound is not None
      and step.capacity is not None
      and reached.bound >= step.capacity
    ):
      return storage.updates(step, row_grads)
    if reached.bound == 0:  # no feature of the table has a gradient
      return []
    step, row_grads = gradient_rows.compact(step, row_grads, reached)
    return storage.updates(step, row_grads)

  def abandon_training_lookup(self) -> None:
    """Drops this replica's training lookup on purpose (a step left out)."""
    self._pending.abandon()

  def _take_pending_step(self, activation_gradients: Any) -> tuple[Any, ...]:
    """This replica's pending lookup (engine, steps) and the gradients.

    Raises:
      RuntimeError: no `lookup(..., training=True)` earlier in this step.
      GradientShapeError: a gradient's shape is not its activation's.
      GradientDtypeError: a gradient that is not floating point.
    """
    pending = self._pending.take()
    if pending is None:
      raise RuntimeError(
        "apply_gradients() needs a lookup(..., training=True) earlier in the "
        "same step (and in the same replica)."
      )
    engine, steps, outputs = pending
    flat_grads = self._flatten_like_config(
      activation_gradients, "activation gradients"
    )
    return (
      engine,
      steps,
      base.check_activation_gradients(
        [layout.path for layout in self._layouts],
        flat_grads,
        outputs,
        self.feature_table_names(),
      ),
    )

  def raise_for_invalid_inputs(self) -> None:
    """Raises if a compiled step refused ids or weights (see `static_bags`).

    A compiled step cannot raise: under the "error" policy it leaves ids
    outside `[0, vocabulary_size)` and NaN, infinite or negative weights
    out of the step and counts them. Call this after compiled steps (the
    Trainer does, before it saves anything); it resets the counts.

    A row-sharded table's all-to-all exchange counts the ids a compiled
    step could not send (a full bucket) the same way. A narrow table whose
    updates saturated values is warned of here, once (`narrow_counts`).

    Raises:
      InvalidInputError: naming the feature, table, an id and its batch row.
      ExchangeOverflowError: naming the table and the capacity to raise.
    """
    if not self._built:
      return
    if self._counters is not None:
      self._counters.raise_for_refused(self._layouts, self._strategy)
    for storage in self._storages.values():
      raise_for_overflow = getattr(storage, "raise_for_overflow", None)
      if raise_for_overflow is not None:
        raise_for_overflow()
    self.narrow_counts()  # warns when a narrow table first saturates


def _on_cpu_only(strategy: tf.distribute.Strategy) -> bool:
  """Whether the tables and steps of `strategy` live on CPUs only."""
  if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices(
    "TPU"
  ):
    return False
  try:
    devices = strategy.extended.worker_devices
  except RuntimeError:  # the default strategy: this host's CPU
    devices = ()
  for device in devices:
    kind = tf.DeviceSpec.from_string(device).device_type
    if kind and kind.upper() != "CPU":
      return False
  return True
