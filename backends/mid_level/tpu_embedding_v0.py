"""The tpu_embedding_v0 backend: TF's own `TPUEmbeddingV0` behind the interface.

For users who want exactly TF's class on TPUs without an embedding
accelerator (`embedding_feature=UNSUPPORTED`, or any TPU). Lookups are TF's:
tables replicated on every TensorCore, sparse and ragged bags densified on the
host (`outside_compilation`) and looked up with a gather.

TF leaves training to the user: `TPUEmbeddingV0` expects a Keras optimizer
over its `embedding_tables`, whose math (e.g. Keras Adagrad's epsilon, Adam's
bias correction, dense updates of every row) is not the TPU optimizers'.
This backend instead applies the table's `tf.tpu.experimental.embedding`
optimizer with TPU semantics, like every other backend: `lookup(training=
True)` records the lookup on a tape; `apply_gradients` turns the activation
gradients into row gradients, keeps only the rows the step looked up (V0's
densified bags also gather row 0 as padding, with zero weight), sums them
over the replicas and calls `backends.optimizers.apply_sparse_update`.

Dynamic-vocabulary tables (`layouts=` with a `vocabulary`): the raw ids are
mapped to rows on the host before the replica step (`map_ids`, the
Trainer's loop), so V0's tables stay static; a row given to a new id is
reset, with every slot, in each replica's copy of TF's variables; a
"zeros" table's ids without a row are left out of their bags (weight 0,
which every combiner leaves out, the shapes unchanged; a dense id's
activation is zeros) and train nothing.

`backend="auto"` never picks this backend: the project's `tensorcore`
implements the same design with static shapes, de-duplicated gathers, input
validation and row-only exchange between replicas, and runs under every
strategy; choose `tpu_embedding_v0` by name to get TF's class itself.

No TPU was reachable where this was written: this backend has only been
checked on CPU: its refusals and gradient bookkeeping, and with TF's own
`TPUEmbeddingV0` there (its TPUStrategy check redirected,
`tests/backends/tf_v0_on_cpu.py`) its training of dynamic tables (the
lookups and updates a static table takes too) against NumPy and
`tensorcore`, on 1 and 2 replicas.
"""

from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorflow.tpu.experimental import embedding

from backends import _tf_internal, base, hardware, layout, optimizers
from backends import pending as pending_lib
from backends.mid_level import common as mid_level
from backends.storage import reset
from backends.vocabulary.hashed import HashedIds


class TPUEmbeddingV0Backend(mid_level.MidLevelBackend):
  """TF's `TPUEmbeddingV0` (replicated tables on a TPU's TensorCores).

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer (applied with TPU semantics).
    strategy: a `TPUStrategy` (any embedding feature).
    bag_widths: see `EmbeddingBackend` (unused: V0 densifies on the host).
    layouts: table name -> `TableLayout` (as `recsys.planning` plans
      them): only a layout's `vocabulary` is read (every table is whole on
      every replica): a dynamic table's index lives on the host.

  Example:
    >>> emb = backends.create(feature_config, Adagrad(0.05), tpu_strategy,
    ...                       backend="tpu_embedding_v0")
  """

  name = "tpu_embedding_v0"
  # TF's TPUEmbeddingV0 looks rows up with plain gathers: no simulated
  # quantization, no SparseCore layouts, float32 tables.
  capabilities = base.Capabilities(
    needs_tpu=True, quantization=False, dynamic_vocabularies=True
  )

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
    layouts: layout.TableLayout
    | Mapping[str, layout.TableLayout]
    | None = None,
  ):
    super().__init__(feature_config, optimizer, strategy, bag_widths=bag_widths)
    for table in self._tables:
      optimizers.check_supported(
        self.optimizer_for(table), self.table_name(table)
      )
    self._pending = _tf_internal.NoDependency(
      pending_lib.PendingLookups(self.name)
    )
    self._take_layouts(layouts)
    #: Tables whose ids without a row (the index's -1) read zeros.
    self._zeros = frozenset(
      name
      for name, vocabulary in self._dynamic.items()
      if getattr(vocabulary, "unknown", None) == "zeros"
    )

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> str | None:
    if hardware.embedding_feature(strategy) is not None:
      return None
    return (
      f"TF's TPUEmbeddingV0 only runs under a TPUStrategy; this is "
      f"{type(strategy).__name__}. Use 'tensorcore', which implements "
      "the same replicated design under any strategy"
    )

  def _create_mid_level(self) -> Any:
    config, _ = mid_level.tf_feature_config(self)
    return embedding.TPUEmbeddingV0(config, optimizer=None)

  def layouts(self) -> dict[str, layout.TableLayout]:
    """Every table whole on every replica, float32, with its vocabulary."""
    return {
      self.table_name(t): layout.TableLayout(
        dtype=t.dtype.name, vocabulary=self._dynamic.get(self.table_name(t))
      )
      for t in self._tables
    }

  # -- dynamic-vocabulary tables -------------------------------------------

  def _build_mid_level(self, mid: Any) -> None:
    """TF's tables and slots, then the dynamic tables' indices (restored
    here when a checkpoint's restore was requested before `build()`)."""
    super()._build_mid_level(mid)
    tables = {self.table_name(t): t for t in self._tables}
    for name, vocabulary in self._dynamic.items():
      if not isinstance(vocabulary, HashedIds):  # hashed: never resets
        reset.check_resettable(tables[name], name)
    self._make_stage(self._reset_rows)

  def _reset_rows(self, name: str, rows: tf.Tensor) -> Any:
    """Writes `rows`' starting values into table `name` and its slots, in
    each replica's copy of TF's variables (cross-replica context)."""
    table = next(t for t in self._tables if self.table_name(t) == name)
    variables = _tf_internal.mid_level_variables(self._mid)[name]
    rows = tf.cast(tf.reshape(rows, [-1]), tf.int64)
    values = reset.starting_values(table, self.optimizer_for(table), rows)
    writes = []
    for key, value in values.items():
      writes += reset.write_each_copy(
        self._strategy, variables[key], rows, value
      )
    return tf.group(writes)

  def _without_unknown_ids(
    self, flat_ids: list[Any], flat_weights: list[Any]
  ) -> tuple[list[Any], list[Any], list[Any]]:
    """The bags of "zeros" tables without their -1 ids (`_left_out`):
    `(ids, weights, masks)`, `masks[i]` a dense feature's `ids >= 0`
    (its -1 reads row 0, then zeros), else None."""
    ids_out, weights_out, masks = [], [], []
    for (_, feature), ids, weights in zip(
      self._flat_features, flat_ids, flat_weights
    ):
      mask = None
      if self.table_name(feature.table) in self._zeros:
        ids, weights, mask = _left_out(ids, weights)
      ids_out.append(ids)
      weights_out.append(weights)
      masks.append(mask)
    return ids_out, weights_out, masks

  def _v0_lookup(self, features: Any, weights: Any) -> tuple[Any, list[Any]]:
    """TF's V0 lookup of `features`, "zeros" tables' -1 ids left out:
    `(activations, the flat ids as given)`."""
    flat = self._flatten_like_config(features, "features")
    if not self._zeros:
      return self._mid.embedding_lookup(features, weights), flat
    flat_weights = (
      self._flatten_like_config(weights, "weights")
      if weights is not None
      else [None] * len(flat)
    )
    ids, flat_weights, masks = self._without_unknown_ids(flat, flat_weights)
    packed, packed_weights = self._pack_inputs(ids, flat_weights)
    activations = tf.nest.flatten(
      self._mid.embedding_lookup(packed, packed_weights)
    )
    activations = [
      a if m is None else a * tf.cast(m, a.dtype)[..., tf.newaxis]
      for a, m in zip(activations, masks)
    ]
    return tf.nest.pack_sequence_as(self._feature_config, activations), flat

  def lookup(
    self, features: Any, weights: Any | None = None, training: bool = False
  ) -> Any:
    """TF's V0 lookup; with `training=True`, recorded for `apply_gradients`."""
    self._maybe_build()
    if not training:
      return self._v0_lookup(features, weights)[0]
    tables = [
      self._variables_by_table()[self.table_name(t)]["parameters"]
      for t in self._tables
    ]
    with tf.GradientTape(
      watch_accessed_variables=False, persistent=False
    ) as tape:
      tape.watch(tables)
      activations, flat = self._v0_lookup(features, weights)
    touched = touched_ids(
      self._flat_features,
      flat,
      [self.table_name(t) for t in self._tables],
      self.table_name,
      self._zeros,
    )
    self._pending.record((tape, tf.nest.flatten(activations), tables, touched))
    return activations

  def apply_gradients(self, activation_gradients: Any) -> None:
    """Applies each table's optimizer (TPU semantics) to the looked-up rows."""
    pending = self._pending.take()
    if pending is None:
      raise RuntimeError(
        "apply_gradients() needs a lookup(..., training=True) "
        "earlier in the same step."
      )
    tape, flat_acts, tables, touched = pending
    flat_grads = base.check_activation_gradients(
      [path for path, _ in self._flat_features],
      self._flatten_like_config(activation_gradients, "activation gradients"),
      flat_acts,
      self.feature_table_names(),
    )
    targets = [a for a, g in zip(flat_acts, flat_grads) if g is not None]
    grads = [g for g in flat_grads if g is not None]
    table_grads = (
      tape.gradient(targets, tables, output_gradients=grads)
      if targets
      else [None] * len(tables)
    )
    replica_ctx = tf.distribute.get_replica_context()
    for table, variable, grad, ids in zip(
      self._tables, tables, table_grads, touched
    ):
      rows = row_gradients(ids, grad, table.dim)
      if self._strategy.num_replicas_in_sync > 1 and replica_ctx is not None:
        ids, rows = sum_over_replicas(replica_ctx, ids, rows)
      name = self.table_name(table)
      slots = self.slot_variables()[name]
      optimizers.apply_sparse_update(
        self.optimizer_for(table), variable, slots, ids, rows
      )

  def input_options(self) -> tf.distribute.InputOptions:
    """Bags stay on the host, where V0 densifies them."""
    return tf.distribute.InputOptions(experimental_fetch_to_device=False)


def _left_out(ids: Any, weights: Any) -> tuple[Any, Any, Any]:
  """A bag's negative ids left out, the shapes kept: in a sparse or ragged
  bag as row 0 with weight 0, which every combiner leaves out ("sum" adds
  nothing, "mean" and "sqrtn" count weights): `(ids, weights, None)`;
  dense ids (one per position: TF's V0 takes no weights for them) as row
  0: `(ids, weights, ids >= 0)`, the caller zeroing those activations."""
  if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
    values = ids.values if isinstance(ids, tf.SparseTensor) else ids.flat_values
    keep = values >= 0
    given = (
      tf.ones_like(values, tf.float32)
      if weights is None
      else (
        weights.values
        if isinstance(weights, tf.SparseTensor)
        else weights.flat_values
      )
    )
    kept_ids = tf.where(keep, values, tf.zeros_like(values))
    kept_weights = tf.where(keep, given, tf.zeros_like(given))
    if isinstance(ids, tf.SparseTensor):
      return (
        tf.SparseTensor(ids.indices, kept_ids, ids.dense_shape),
        tf.SparseTensor(ids.indices, kept_weights, ids.dense_shape),
        None,
      )
    return (
      ids.with_flat_values(kept_ids),
      ids.with_flat_values(kept_weights),
      None,
    )
  ids = tf.convert_to_tensor(ids)
  mask = ids >= 0
  return tf.where(mask, ids, tf.zeros_like(ids)), weights, mask


def _feature_ids(feature: Any, ids: Any) -> tf.Tensor:
  """The ids a feature's lookup reads (sequence features: the first L)."""
  length = feature.max_sequence_length
  if isinstance(ids, tf.RaggedTensor):
    return (ids[:, :length] if length else ids).flat_values
  if isinstance(ids, tf.SparseTensor):
    if length:
      return tf.boolean_mask(ids.values, ids.indices[:, -1] < length)
    return ids.values
  return tf.reshape(tf.convert_to_tensor(ids), [-1])


def touched_ids(
  flat_features: list[tuple[str, Any]],
  flat_ids: list[Any],
  table_names: list[str],
  name_of,
  zeros: frozenset[str] = frozenset(),
) -> list[tf.Tensor]:
  """Unique int64 ids `[U]` each table's lookup reads, in table order; of
  the dynamic tables in `zeros`, not their -1 (no row: reads nothing)."""
  per_table: dict[str, list[tf.Tensor]] = {name: [] for name in table_names}
  for (_, feature), ids in zip(flat_features, flat_ids):
    name = name_of(feature.table)
    ids = tf.cast(_feature_ids(feature, ids), tf.int64)
    if name in zeros:
      ids = tf.boolean_mask(ids, ids >= 0)
    per_table[name].append(ids)
  return [tf.unique(tf.concat(per_table[name], 0))[0] for name in table_names]


def row_gradients(ids: tf.Tensor, table_grad: Any, dim: int) -> tf.Tensor:
  """Gradient `[U, D]` of each of the unique `ids` from a table's gradient.

  Args:
    ids: int64 `[U]` unique ids the step looked up.
    table_grad: `tf.IndexedSlices` (gradient of gathers; indices may repeat
      and include rows not in `ids`, e.g. padding), a dense `[V, D]` tensor,
      or None.
    dim: the table's width D.

  Returns:
    float32 `[U, D]`: the summed gradient of each id; entries for indices
    outside `ids` are dropped.
  """
  count = tf.size(ids)
  if table_grad is None:
    return tf.zeros([count, dim], tf.float32)
  if isinstance(table_grad, tf.IndexedSlices):
    indices = tf.cast(table_grad.indices, tf.int64)
    values = table_grad.values
  else:
    return tf.gather(tf.convert_to_tensor(table_grad), ids)
  # `ids` are unique, so tf.unique keeps them first and in order: positions
  # [0, U) are `ids`, anything after is a row the step did not look up.
  _, position = tf.unique(tf.concat([ids, indices], 0), out_idx=tf.int32)
  position = position[count:]
  summed = tf.math.unsorted_segment_sum(
    tf.reshape(values, [-1, dim]), position, count + tf.size(indices)
  )
  return summed[:count]


def sum_over_replicas(
  replica_ctx, ids: tf.Tensor, grads: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
  """All-gathers every replica's (ids, grads) and sums them per unique id."""
  all_ids = replica_ctx.all_gather(ids, axis=0)
  all_grads = replica_ctx.all_gather(grads, axis=0)
  unique_ids, index = tf.unique(all_ids, out_idx=tf.int32)
  return unique_ids, tf.math.unsorted_segment_sum(
    all_grads, index, tf.size(unique_ids)
  )
