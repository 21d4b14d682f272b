"""The TensorCore backend: replicated tables, lookups on the compute devices.

This is the design of TF's `TPUEmbeddingV0` (the path for TPUs without an
embedding accelerator), implemented so that it runs under any strategy —
default, `MirroredStrategy`, `MultiWorkerMirroredStrategy`, `TPUStrategy` —
and improved where V0 falls short:

* The embedding optimizer is applied here, as sparse row updates with the TPU
  optimizers' math (`backends.optimizers`), after summing each touched row's
  gradient over the global batch.
* Replicas exchange only the rows they touched (unique ids and their summed
  gradients, via `all_gather`), never a dense all-reduce of whole tables.
  Every replica then applies the same update, so copies stay bit-identical.
* Ids are de-duplicated per table before the gather (features sharing a
  table share one gather).
* Inputs are validated: ids outside `[0, vocabulary_size)` raise an error
  naming the feature, table, id and batch row (or are dropped / mapped to an
  OOV row, and counted).
* `preprocess` pads sparse and ragged bags to a static width on the host.
* On CPU hosts a training step runs fused C++ kernels (`backends.kernels`:
  one pass each to flatten padded bags, to de-duplicate and look up, for the
  row gradients and for the optimizer update) instead of a chain of generic
  TF ops; same math.
* Compiled steps (a TPU, `jit_compile=True`) take a static-shape path
  (`backends.static_bags`): fixed-capacity de-duplication, padding slots that
  never touch a row, a fixed-size exchange; same math again.

It keeps V0's public API (`embedding_lookup`, `__call__`, `embedding_tables`,
slots through `slot_variable_creation_fn`, building on first use), so V0's
own training-loop example (a tape on `embedding_tables` and a Keras
optimizer, in a `tf.range` loop) runs as written, with several mirrored
replicas and compiled.

Example:
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="items")
  >>> config = {"item": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> opt = tf.tpu.experimental.embedding.Adagrad(0.1)
  >>> emb = TensorCoreEmbedding(config, opt)
  >>> with tf.GradientTape() as tape:
  ...   acts = emb({"item": tf.constant([3, 5])}, training=True)
  ...   loss = tf.reduce_sum(acts["item"])
  >>> emb.apply_gradients(tape.gradient(loss, acts))
"""

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from backends import _bags, base, hardware, kernels, optimizers, static_bags
from backends import inputs as inputs_lib
from backends import pending as pending_lib

embedding = tf.tpu.experimental.embedding
log = logging.getLogger("recsys.backends")


@dataclasses.dataclass
class _TableStep:
  """What a training lookup leaves for `apply_gradients`, per table.

  The table's features are looked up as one flat bag: `index` maps every id
  (all features, in feature order) to its row in `unique_ids`, `segments`
  to its output row in the features' activations stacked in feature order,
  and `scale` (None when every id counts once) is d act / d row of each id.
  """

  unique_ids: tf.Tensor  # int64 [U]
  rows: tf.Tensor | None  # float32 [U, D], the rows at lookup (TF ops)
  index: tf.Tensor  # int32 [N]
  segments: tf.Tensor  # int32 [N]
  scale: tf.Tensor | None  # float32 [N] or None
  positions: list[int]  # per feature: index in the flat feature list
  num_segments: list[tf.Tensor]  # per feature: S_f
  capacity: int | None  # static bound on U, or None


# The backend has no data-dependent Python control flow: AutoGraph need not
# convert it (faster traces), and its errors reach the caller as raised.
_not_converted = tf.autograph.experimental.do_not_convert


class _Counters:
  """Per-feature input counters (not checkpointed): invalid, truncated ids."""

  def __init__(self, paths: list[str]):
    def counter(kind, path):
      return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name=f"{kind}_{path.replace('/', '_')}",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
      )

    self.invalid = {p: counter("invalid_ids", p) for p in paths}
    self.truncated = {p: counter("truncated_ids", p) for p in paths}
    # Compiled steps cannot raise: they count refused ids and weights here
    # (and keep one refused id with its batch row) for
    # `raise_for_invalid_inputs`.
    self.refused_ids = {p: counter("refused_ids", p) for p in paths}
    self.refused_weights = {p: counter("refused_weights", p) for p in paths}
    self.refused_example = {
      p: tf.Variable(
        tf.zeros([2], tf.int64),
        trainable=False,
        name=f"refused_example_{p.replace('/', '_')}",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
      )
      for p in paths
    }


class TensorCoreEmbedding(base.EmbeddingBackend):
  """Replicated embedding tables trained with TPU optimizer semantics anywhere.

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
      with the fused C++ kernels of `backends.kernels` (built on first use;
      the TF ops when they cannot be). False: always the TF ops.
    static_shapes: run the static-shape path (`backends.static_bags`) that a
      compiled step needs. None (default): whenever the step is compiled
      (under `tf.function(jit_compile=True)` or a TPUStrategy), and for
      lookups whose table gradients a tape may take on several replicas.
      True: always (what a compiled step computes, also uncompiled, e.g. on
      CPU replicas, whose collectives XLA cannot compile). False: never
      (a compiled step then fails).
  """

  name = "tensorcore"
  capabilities = base.Capabilities()
  options = frozenset(
    {"bag_widths", "invalid_ids", "fused_kernels", "static_shapes"}
  )
  _kernels = None  # the fused CPU ops (backends.kernels), set by build()

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
    if invalid_ids not in inputs_lib.ID_POLICIES:
      raise ValueError(
        f"invalid_ids={invalid_ids!r}; use one of "
        f"{', '.join(inputs_lib.ID_POLICIES)}."
      )
    self._invalid_ids = invalid_ids
    self._layouts = [
      inputs_lib.FeatureLayout(path, feature, self.table_name(feature.table))
      for path, feature in self._flat_features
    ]
    for table in self._tables:
      opt = self.optimizer_for(table)
      if opt is not None:
        optimizers.check_supported(opt, self.table_name(table))
    # Pending training lookups, per replica thread (MirroredStrategy runs
    # each replica's step in its own thread and may interleave them).
    self._pending = data_structures.NoDependency(
      pending_lib.PendingLookups(self.name)
    )
    # Built with the tables; None: not counted.
    self._counters: _Counters | None = None

  # -- variables -----------------------------------------------------------

  @base.cross_replica_build
  def build(self) -> None:
    """Creates tables and slots under the backend's strategy (idempotent)."""
    if self._built:
      return
    with tf.init_scope(), self._strategy.scope():
      self._create_variables()
      self._counters = data_structures.NoDependency(
        _Counters([layout.path for layout in self._layouts])
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
    if self._use_fused_kernels and _on_cpu_only(self._strategy):
      self._kernels = kernels.load()
    self._built = True

  def _create_variables(self) -> None:
    """Every table's variables (`_create_table_variables`), by table name."""
    self._variables = data_structures.NoDependency(
      {
        self.table_name(t): self._create_table_variables(t)
        for t in self._tables
      }
    )

  def _create_table_variables(self, table) -> dict[str, tf.Variable]:
    name = self.table_name(table)
    shape = (table.vocabulary_size, table.dim)

    def getter(name, shape, dtype, initializer, trainable):
      del shape  # the custom getter may drop it; use the table's shape
      return tf.Variable(
        initial_value=functools.partial(
          initializer, (table.vocabulary_size, table.dim), dtype=dtype
        ),
        name=name,
        shape=(table.vocabulary_size, table.dim),
        dtype=dtype,
        trainable=trainable,
      )

    def create(var_name, initializer, trainable):
      # Restore-on-create: a pending checkpoint restore fills the value.
      return self._add_variable_with_custom_getter(
        name=var_name,
        initializer=initializer,
        shape=shape,
        dtype=tf.float32,
        getter=getter,
        trainable=trainable,
      )

    params = create(name, table.initializer, True)
    opt = self.optimizer_for(table)
    slots = {}
    if opt is not None:
      slots = opt._create_slots(  # pylint: disable=protected-access
        params, lambda slot, init: create(f"{name}/{slot}", init, False)
      )
    return {"parameters": params, **slots}

  @property
  def embedding_tables(self) -> dict[Any, tf.Variable]:
    """The table variables, keyed by `TableConfig` (V0's API)."""
    self._maybe_build()
    return {
      t: self._variables[self.table_name(t)]["parameters"] for t in self._tables
    }

  def slot_variables(self) -> dict[str, dict[str, tf.Variable]]:
    self._maybe_build()
    return {
      name: {k: v for k, v in table_vars.items() if k != "parameters"}
      for name, table_vars in self._variables.items()
    }

  def input_stats(self) -> dict[str, dict[str, int]]:
    """Counts of invalid (dropped / mapped) and truncated ids per feature."""
    self._maybe_build()
    c = self._counters
    if c is None:
      return {}
    return {
      "invalid_ids": {p: int(v.numpy()) for p, v in c.invalid.items()},
      "truncated_ids": {p: int(v.numpy()) for p, v in c.truncated.items()},
    }

  def _maybe_build(self):
    """Builds on first use, also from inside a replica function.

    TF's V0 builds lazily too: its documented loop first touches
    `embedding_tables` inside `strategy.run`; `build` then runs once for
    every replica, in cross-replica context (`base.cross_replica_build`).
    """
    if not self._built:
      self.build()

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
      width = layout.sequence_length or self._bag_widths[layout.path]
      if width and isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
        out.append(
          inputs_lib.pad_bags(
            inp,
            w,
            width,
            inputs_lib.describe(layout),
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
    if self._static_path(training):
      return self._static_lookup(features, weights, training)
    # Training steps only: lookups for evaluation or export stay TF ops
    # (a SavedModel must not need this library).
    fused = self._fused_ops() if training else None
    bags = self._flat_bags(features, weights, fused)

    outputs: list[tf.Tensor | None] = [None] * len(bags)
    steps = {}
    for table in self._tables:
      name = self.table_name(table)
      positions = self._positions_of(name)
      table_bags = [bags[i] for i in positions]
      # All features of the table as one flat bag: one de-duplication, one
      # gather of the unique rows ([U, D]; a tape on the table sees gradient
      # IndexedSlices of U rows), one segment sum into the activations of
      # every feature stacked in feature order.
      flat = _bags.concat_bags(table_bags, table.combiner)
      found = _bags.lookup(
        flat,
        self._variables[name]["parameters"],
        self._gather_rows,
        fused,
        self._concurrent_calls(),
      )
      for i, bag, out in zip(
        positions, table_bags, _bags.split_features(found.acts, flat)
      ):
        outputs[i] = self._shape_output(self._layouts[i], bag, out)
      if training:
        capacities = [b.capacity for b in table_bags if b.capacity is not None]
        capacity = (
          min(sum(capacities), table.vocabulary_size)
          if len(capacities) == len(table_bags)
          else None
        )
        steps[name] = _TableStep(
          found.unique_ids,
          found.rows,
          found.index,
          flat.segments,
          flat.scale,
          positions,
          flat.sizes,
          capacity,
        )
    if training:
      self._pending.record((steps, outputs), outputs)
    return nest.pack_sequence_as(self._feature_config, outputs)

  def _static_path(self, training: bool) -> bool:
    """Whether this trace takes the static-shape path (see `static_shapes`)."""
    if self._static_shapes is not None:
      return self._static_shapes
    if _in_xla_context() or hardware.is_tpu(self._strategy):
      return True
    # A tape may take the tables' gradients (V0's loop, a Keras optimizer on
    # `embedding_tables`): several replicas all-reduce them, which needs the
    # same size on every replica.
    return (
      not training
      and self._strategy.num_replicas_in_sync > 1
      and tf.distribute.get_replica_context() is not None
      and record.could_possibly_record()
    )

  def _static_bags(
    self, features: Any, weights: Any | None
  ) -> list[static_bags.StaticBags]:
    """Every feature as validated `StaticBags` with its combiner's scale.

    Refused ids and weights are counted per feature (the counters behind
    `raise_for_invalid_inputs`); outside a compiled step, the "error" policy
    also raises (eagerly) or fails the step (graph) right away.
    """
    flat, flat_w, counters = self._flat_inputs(features, weights)
    compiled = _in_xla_context()
    out = []
    for layout, inp, w in zip(self._layouts, flat, flat_w):
      if not compiled:  # a compiled step cannot raise: it leaves such ids out
        inputs_lib.check_bag_structure(inputs_lib.describe(layout), inp, w)
      bags = static_bags.from_input(
        layout, inp, w, self._bag_widths[layout.path]
      )
      if layout.feature.validate_weights_and_indices:
        bags, report = static_bags.validate(layout, bags, self._invalid_ids)
        if self._invalid_ids == "error" and not compiled:
          bags = dataclasses.replace(
            bags, ids=_raise_for_report(layout, report, bags.ids)
          )
        if counters is not None:
          c = counters
          if self._invalid_ids == "error":
            c.refused_ids[layout.path].assign_add(report.bad_ids)
            example = c.refused_example[layout.path]
            example.assign(
              tf.where(report.bad_ids > 0, report.example, example.read_value())
            )
          else:
            c.invalid[layout.path].assign_add(report.bad_ids)
          c.refused_weights[layout.path].assign_add(report.bad_weights)
      if counters is not None and (
        layout.sequence_length or self._bag_widths[layout.path]
      ):
        counters.truncated[layout.path].assign_add(bags.truncated)
      out.append(
        static_bags.with_combiner_scale(bags, layout.feature.table.combiner)
      )
    return out

  def _static_lookup(
    self, features: Any, weights: Any | None, training: bool
  ) -> Any:
    """`lookup` with static shapes only, as XLA and TPUs compile it.

    Each table's ids are de-duplicated into a fixed capacity (the number of
    id slots of its features), its unique rows gathered once (a tape on the
    table sees `IndexedSlices` of that fixed size) and combined per feature.
    """
    bags = self._static_bags(features, weights)
    outputs: list[tf.Tensor | None] = [None] * len(bags)
    steps = {}
    replicas = self._strategy.num_replicas_in_sync
    compiled = _in_xla_context()
    for table in self._tables:
      name = self.table_name(table)
      positions = self._positions_of(name)
      table_bags = [bags[i] for i in positions]
      ids = tf.concat([b.ids for b in table_bags], 0)
      valid = tf.concat([b.valid for b in table_bags], 0)
      dd = static_bags.dedup(ids, valid, table.vocabulary_size)
      params = self._variables[name]["parameters"]
      dense_reason = None
      if not training and record.could_possibly_record():
        # A tape may take the table's gradient (V0's loop with a Keras
        # optimizer on `embedding_tables`).
        if any(b.capacity is None for b in table_bags) and replicas > 1:
          dense_reason = (
            "ragged/sparse inputs without a static width under several replicas"
          )
        elif compiled:
          dense_reason = (
            "a compiled step (Keras's sparse updates, e.g. "
            "ResourceSparseApplyAdagradV2, have no XLA kernel)"
          )
      if dense_reason:
        # What V0 gives on a TPU: a dense gradient of the table, the same
        # shape on every replica, that every Keras optimizer can compile.
        _warn_dense_table_gradient(
          name, table.vocabulary_size, table.dim, dense_reason
        )
        rows = _gather_with_dense_gradient(params, dd.ids)
      else:
        rows = tf.gather(params, dd.ids)
      sizes = [
        tf.shape(b.ids)[0] if b.capacity is None else b.capacity
        for b in table_bags
      ]
      indices = tf.split(dd.index, sizes) if len(table_bags) > 1 else [dd.index]
      for i, bag, index in zip(positions, table_bags, indices):
        acts = static_bags.combine(rows, index, bag)
        outputs[i] = self._shape_output(self._layouts[i], bag, acts)
      if training:
        steps[name] = _StaticTableStep(dd, rows, table_bags, positions)
    if training:
      self._pending.record((steps, outputs), outputs)
    return nest.pack_sequence_as(self._feature_config, outputs)

  def _static_apply(self, steps, flat_grads) -> None:
    """`apply_gradients` for a static-shape lookup (see `_static_lookup`)."""
    replica_ctx = tf.distribute.get_replica_context()
    exchange = (
      self._strategy.num_replicas_in_sync > 1 and replica_ctx is not None
    )
    groups: dict[int, tuple[Any, list[optimizers.SparseUpdate]]] = {}
    for table in self._tables:
      name = self.table_name(table)
      step = steps[name]
      grads = _bags.feature_gradients(
        flat_grads,
        step.positions,
        [bag.num_segments for bag in step.bags],
        table.dim,
      )
      dd = step.dedup
      capacity = tf.shape(dd.ids)[0]
      row_grads = static_bags.pad_rows(
        static_bags.row_gradients(grads, step.bags, dd.index, capacity),
        dd.num_unique,
      )
      ids, rows, num_unique = dd.ids, step.rows, dd.num_unique
      if exchange:
        dynamic = [
          self._layouts[p].path
          for p, b in zip(step.positions, step.bags)
          if b.capacity is None
        ]
        if dynamic:
          raise static_bags.StaticShapeError(
            f"table {name!r}: feature(s) {dynamic} have no static number of "
            "ids, so the rows that replicas exchange have no fixed size; "
            "set bag_widths for them and run the backend's preprocess() in "
            "the input pipeline."
          )
        ids, row_grads, num_unique = _static_sum_across_replicas(
          replica_ctx, dd, row_grads, table.vocabulary_size
        )
        rows = None  # other replicas' rows too: gathered by the update
      table_vars = self._variables[name]
      slots = {k: v for k, v in table_vars.items() if k != "parameters"}
      groups.setdefault(
        id(self.optimizer_for(table)), (self.optimizer_for(table), [])
      )[1].append(
        optimizers.SparseUpdate(
          table_vars["parameters"],
          slots,
          ids,
          row_grads,
          rows,
          keep=num_unique > 0,
        )
      )
    for opt, updates in groups.values():
      optimizers.apply_sparse_updates(opt, updates)

  def raise_for_invalid_inputs(self) -> None:
    """Raises if a compiled step refused ids or weights (see `static_bags`).

    A compiled step cannot raise: under the "error" policy it leaves ids
    outside `[0, vocabulary_size)` and NaN, infinite or negative weights
    out of the step and counts them. Call this after compiled steps (the
    Trainer does, before it saves anything); it resets the counts.

    Raises:
      InvalidInputError: naming the feature, table, an id and its batch row.
    """
    if not self._built or self._counters is None:
      return
    c = self._counters
    for layout in self._layouts:
      path = layout.path
      bad_ids = int(c.refused_ids[path].numpy())
      bad_weights = int(c.refused_weights[path].numpy())
      if not bad_ids and not bad_weights:
        continue
      examples = [
        v.numpy()
        for v in self._strategy.experimental_local_results(
          c.refused_example[path]
        )
      ]
      example = next((e for e in examples if e.any()), examples[0])
      for var in (
        c.refused_ids[path],
        c.refused_weights[path],
        c.refused_example[path],
      ):
        for local in self._strategy.experimental_local_results(var):
          local.assign(tf.zeros_like(local))
      what = inputs_lib.describe(layout)
      if bad_ids:
        raise inputs_lib.InvalidInputError(
          f"{what} got id {example[0]} at batch row {example[1]} in a "
          f"compiled step ({bad_ids} such ids); ids must be in [0, "
          f"{layout.feature.table.vocabulary_size}). The step left them "
          "out; nothing was saved after it."
        )
      raise inputs_lib.InvalidInputError(
        f"{what} got {bad_weights} weights that are NaN, infinite or "
        "negative in a compiled step; weights must be finite and >= 0. The "
        "step left those ids out; nothing was saved after it."
      )

  def _concurrent_calls(self) -> int:
    """How many fused kernel calls of one kind a step runs side by side."""
    return len(self._tables) * self._strategy.num_replicas_in_sync

  def _fused_ops(self):
    """The fused kernels' module if this trace can run them, else None.

    Not inside XLA compilation (the kernels have no XLA implementation).
    """
    if self._kernels is None or _in_xla_context():
      return None
    return self._kernels

  def _flat_bags(
    self, features: Any, weights: Any | None, fused_ops: Any | None = None
  ) -> list[inputs_lib.FlatBags]:
    """Every feature's input as validated flat bags, in config order.

    Counts invalid and truncated ids when the backend keeps counters (they
    are per-replica sums: only countable inside a replica). `fused_ops`: the
    fused kernels, to flatten padded bags in one op.
    """
    flat, flat_w, counters = self._flat_inputs(features, weights)
    # In a graph the fused op that flattens padded bags checks their ids
    # itself (same message): six ops per feature fewer. Eagerly the Python
    # check raises its InvalidInputError.
    kernel_checks = (
      fused_ops is not None
      and self._invalid_ids == "error"
      and not tf.executing_eagerly()
    )
    bags = []
    for layout, inp, w in zip(self._layouts, flat, flat_w):
      bag = inputs_lib.to_flat_bags(
        layout,
        inp,
        w,
        self._bag_widths[layout.path],
        fused_ops=fused_ops,
        check_ids=kernel_checks and layout.feature.validate_weights_and_indices,
      )
      if layout.feature.validate_weights_and_indices:
        bag, num_invalid = inputs_lib.validate(layout, bag, self._invalid_ids)
        if counters is not None and self._invalid_ids != "error":
          counters.invalid[layout.path].assign_add(num_invalid)
      if counters is not None and (
        layout.sequence_length or self._bag_widths[layout.path]
      ):
        counters.truncated[layout.path].assign_add(bag.truncated)
      bags.append(bag)
    return bags

  def _flat_inputs(
    self, features: Any, weights: Any | None
  ) -> tuple[list[Any], list[Any], _Counters | None]:
    """Features and weights flattened in config order, and the counters.

    The counters (invalid, truncated ids) are None when nothing is counted:
    the backend keeps none, or there is no replica context (they are
    per-replica sums).
    """
    flat = self._flatten_like_config(features, "features")
    flat_w = (
      self._flatten_like_config(weights, "weights")
      if weights is not None
      else [None] * len(flat)
    )
    if tf.distribute.get_replica_context() is None:
      return flat, flat_w, None
    return flat, flat_w, self._counters

  def _positions_of(self, table_name: str) -> list[int]:
    """The indices of the table's features in the flat feature list."""
    return [
      i
      for i, layout in enumerate(self._layouts)
      if layout.table_name == table_name
    ]

  def _shape_output(
    self,
    layout,
    bag: inputs_lib.FlatBags | static_bags.StaticBags,
    acts: tf.Tensor,
  ):
    dim = layout.feature.table.dim
    out_shape = layout.output_shape(None)
    if out_shape is not None:
      return tf.reshape(acts, out_shape + [dim])
    if bag.sequence_length:
      return tf.reshape(acts, [-1, bag.sequence_length, dim])
    return acts

  # -- training ----------------------------------------------------------------

  @_not_converted
  def apply_gradients(self, activation_gradients: Any) -> None:
    """Applies each table's embedding optimizer to the rows this step touched.

    Call in the same step as `lookup(..., training=True)`, with the gradient
    of the loss with respect to its activations (None leaves: no gradient).
    Under several replicas the touched rows' gradients are summed over the
    global batch before the (identical) update on every replica.
    """
    steps, flat_grads = self._take_pending_step(activation_gradients)
    if any(isinstance(s, _StaticTableStep) for s in steps.values()):
      self._static_apply(steps, flat_grads)
      return
    replica_ctx = tf.distribute.get_replica_context()
    num_replicas = self._strategy.num_replicas_in_sync
    exchange = num_replicas > 1 and replica_ctx is not None
    # Tables sharing an optimizer are updated together: one run of its
    # element-wise math over all their touched rows (same numbers).
    groups: dict[int, tuple[Any, list[optimizers.SparseUpdate]]] = {}
    fused = None if exchange else self._fused_ops()
    for table in self._tables:
      name = self.table_name(table)
      step = steps[name]
      opt = self.optimizer_for(table)
      table_vars = self._variables[name]
      if fused is not None and step.rows is None:
        # The fused lookup's backward pass and update: one kernel call.
        if optimizers.apply_bag_update(
          opt,
          table_vars["parameters"],
          {k: v for k, v in table_vars.items() if k != "parameters"},
          step.unique_ids,
          step.index,
          self._activation_gradients(table, step, flat_grads),
          step.segments,
          step.scale,
          fused,
          self._concurrent_calls(),
        ):
          continue
      row_grads = self._row_gradients(table, step, flat_grads)
      ids = step.unique_ids
      rows = step.rows  # this step's rows of the table: no second gather
      if exchange:
        if step.capacity is None:
          _warn_dynamic_exchange(name)
        ids, row_grads = _sum_across_replicas(
          replica_ctx, ids, row_grads, step.capacity
        )
        rows = None  # other replicas' rows too: gathered by the update
      slots = {k: v for k, v in table_vars.items() if k != "parameters"}
      groups.setdefault(id(opt), (opt, []))[1].append(
        optimizers.SparseUpdate(
          table_vars["parameters"], slots, ids, row_grads, rows
        )
      )
    self._apply_updates(groups)

  def abandon_training_lookup(self) -> None:
    """Drops this replica's training lookup on purpose (a step left out)."""
    self._pending.abandon()

  def _take_pending_step(
    self, activation_gradients: Any
  ) -> tuple[dict[str, Any], list[Any]]:
    """This replica's pending training lookup, and the gradients flattened.

    Raises:
      RuntimeError: no `lookup(..., training=True)` earlier in this step.
      GradientShapeError: a gradient's shape is not its activation's.
    """
    pending = self._pending.take()
    if pending is None:
      raise RuntimeError(
        "apply_gradients() needs a lookup(..., training=True) earlier in the "
        "same step (and in the same replica)."
      )
    steps, outputs = pending
    flat_grads = self._flatten_like_config(
      activation_gradients, "activation gradients"
    )
    return steps, base.check_activation_gradients(
      [layout.path for layout in self._layouts],
      flat_grads,
      outputs,
      self.feature_table_names(),
    )

  def _activation_gradients(
    self, table, step: _TableStep, flat_grads
  ) -> tf.Tensor:
    """The table's features' activation gradients stacked: `[sum_f S_f, D]`."""
    grads = _bags.feature_gradients(
      flat_grads, step.positions, step.num_segments, table.dim
    )
    return tf.concat(grads, 0) if len(grads) > 1 else grads[0]

  def _row_gradients(self, table, step: _TableStep, flat_grads) -> tf.Tensor:
    """d(loss)/d(row) for each unique row: [U, D], one segment reduction."""
    return _bags.row_gradients(
      self._activation_gradients(table, step, flat_grads),
      step.index,
      step.segments,
      step.scale,
      tf.size(step.unique_ids, out_type=tf.int32),
      self._fused_ops(),
    )

  # -- where the rows live (the sharded backend overrides these) ---------------

  def _gather_rows(self, params: tf.Variable, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of the table `params` (`_bags.lookup`'s `gather_rows`)."""
    return tf.gather(params, ids)

  def _apply_updates(
    self, groups: Mapping[int, tuple[Any, list[optimizers.SparseUpdate]]]
  ) -> None:
    """Applies each optimizer's updates (tables sharing it: one run)."""
    fused = self._fused_ops()
    for opt, updates in groups.values():
      optimizers.apply_sparse_updates(opt, updates, fused_ops=fused)


@dataclasses.dataclass
class _StaticTableStep:
  """What a static-shape training lookup leaves for `apply_gradients`."""

  dedup: static_bags.Dedup
  rows: tf.Tensor  # [N, D], the unique slots' rows
  bags: list[static_bags.StaticBags]  # the table's features, in order
  positions: list[int]  # their index in the feature list


def _raise_for_report(
  layout, report: static_bags.Report, ids: tf.Tensor
) -> tf.Tensor:
  """`ids`, after checks that raise (eager) or fail the step (graph)."""
  what = inputs_lib._template_safe(inputs_lib.describe(layout))  # pylint: disable=protected-access
  vocab = layout.feature.table.vocabulary_size
  checks = inputs_lib._check(  # pylint: disable=protected-access
    tf.equal(report.bad_ids, 0),
    what + f" got id {{}} at batch row {{}}; ids must be in [0, {vocab}).",
    lambda: [report.example[0], report.example[1]],
  )
  checks += inputs_lib._check(  # pylint: disable=protected-access
    tf.equal(report.bad_weights, 0),
    what + " got {} weights that are NaN, infinite or negative; weights "
    "must be finite and >= 0.",
    lambda: [report.bad_weights],
  )
  with tf.control_dependencies(checks):
    return tf.identity(ids)


def _gather_with_dense_gradient(
  params: tf.Variable, ids: tf.Tensor
) -> tf.Tensor:
  """`params[ids]` whose gradient for the table is a dense `[V, D]` tensor."""
  vocab = params.shape[0]

  @tf.custom_gradient
  def gather(table):
    def grad(upstream):
      return tf.math.unsorted_segment_sum(upstream, ids, vocab)

    return tf.gather(table, ids), grad

  return gather(tf.convert_to_tensor(params))


@functools.cache
def _warn_dense_table_gradient(
  table_name: str, vocab: int, dim: int, reason: str
) -> None:
  log.warning(
    "table %r: a tape on the table in %s: its gradient is a dense [%d, %d] "
    "tensor (%.1f MB per step, all-reduced over replicas), as TF's "
    "TPUEmbeddingV0 gives it on a TPU. Train the tables with "
    "lookup(..., training=True) and apply_gradients() (the backend's "
    "sparse update, TPU optimizer math), with bag_widths= and preprocess() "
    "in the input pipeline, to update only the rows a step touched.",
    table_name,
    reason,
    vocab,
    dim,
    vocab * dim * 4 / 1e6,
  )


def _static_sum_across_replicas(
  replica_ctx, dd: static_bags.Dedup, grads: tf.Tensor, vocabulary_size: int
):
  """Every replica's unique rows and gradients, summed per id; fixed sizes.

  Returns `(ids, grads, num_unique)` laid out like `static_bags.dedup`'s
  result over the `R * N` gathered slots: identical on every replica, so
  the replicas' copies of the table stay bit-identical.
  """
  real = tf.range(tf.shape(dd.ids)[0]) < dd.num_unique
  all_ids = replica_ctx.all_gather(dd.ids, axis=0)
  all_real = replica_ctx.all_gather(tf.cast(real, tf.int32), axis=0) > 0
  all_grads = replica_ctx.all_gather(grads, axis=0)
  merged = static_bags.dedup(all_ids, all_real, vocabulary_size)
  summed = tf.math.unsorted_segment_sum(
    all_grads * tf.cast(all_real, grads.dtype)[:, tf.newaxis],
    merged.index,
    tf.shape(all_ids)[0],
  )
  return (
    merged.ids,
    static_bags.pad_rows(summed, merged.num_unique),
    merged.num_unique,
  )


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


def _in_xla_context() -> bool:
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  from tensorflow.python.ops import control_flow_util  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  return control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


@functools.cache
def _warn_dynamic_exchange(table_name: str) -> None:
  log.warning(
    "table %r: the touched rows exchanged between replicas have a dynamic "
    "size because some of its features have sparse/ragged inputs without a "
    "static width. Several steps in one tf.function loop then fail under "
    "MirroredStrategy ('Shape mismatch in the collective instance'); give "
    "bag_widths= and run preprocess() in the input pipeline.",
    table_name,
  )


def _sum_across_replicas(
  replica_ctx, ids: tf.Tensor, grads: tf.Tensor, capacity: int | None
) -> tuple[tf.Tensor, tf.Tensor]:
  """Exchanges each replica's touched rows and sums them per unique id.

  With a static `capacity` (an upper bound on each replica's unique ids) the
  exchanged tensors are padded to it (ids -1), so the collective has the same
  shape every step, as collectives inside a loop need. Every replica ends with
  the same (ids, grads), in the same order, so the updates it applies keep
  the replicated tables bit-identical.
  """
  if capacity is not None:
    pad = capacity - tf.size(ids)
    ids = tf.reshape(tf.pad(ids, [[0, pad]], constant_values=-1), [capacity])
    grads = tf.reshape(
      tf.pad(grads, [[0, pad], [0, 0]]), [capacity, grads.shape[-1]]
    )
  all_ids = replica_ctx.all_gather(ids, axis=0)
  all_grads = replica_ctx.all_gather(grads, axis=0)
  if capacity is not None:
    keep = all_ids >= 0
    all_ids = tf.boolean_mask(all_ids, keep)
    all_grads = tf.boolean_mask(all_grads, keep)
  unique_ids, index = tf.unique(all_ids, out_idx=tf.int32)
  summed = tf.math.unsorted_segment_sum(all_grads, index, tf.size(unique_ids))
  return unique_ids, summed
