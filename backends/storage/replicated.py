"""Replicated storage: a full copy of the table and its slots on every replica.

TF's `TPUEmbeddingV0` design. Under several replicas the tables are
`MirroredVariable`s; a step gathers its rows from the local copy, and the
update exchanges only the rows the replicas touched (unique ids and their
summed gradients, via `all_gather`), never a dense all-reduce of whole
tables. Every replica then applies the same update, so the copies stay
bit-identical.

A narrow table (`dtype` bfloat16 or float16, `backends.storage.narrow`) keeps
its rows in that dtype and its slots in float32; `gather` upcasts the rows,
the update rounds them back stochastically (the same draws on every
replica). Checkpoints hold the rows in the table's
dtype; a float32 checkpoint restores into a narrow table and back (cast;
values beyond the narrow dtype's range refused unless `saturate_restores`,
`backends.storage.narrow.NarrowRangeError`). The values the updates saturate are
counted (`saturated`).

Example:
  >>> storage = Replicated(table, "items", Adagrad(0.1), strategy)
  >>> storage.create(tracker)
"""

import functools
import logging
from typing import Any

import tensorflow as tf

from backends import _tf_internal, optimizers, static_bags
from backends.storage import base, narrow, reset, row_init
from backends.table_step import TableStep

log = logging.getLogger("recsys.backends")


class Replicated(base.TableStorage):
  """A full copy of the table and its slots on every replica."""

  placement = "replicated"

  def __init__(
    self,
    *args: Any,
    dtype: str = "float32",
    rounding_seed: int = 0,
    saturate_restores: bool = False,
  ):
    super().__init__(*args)
    self.dtype = tf.as_dtype(dtype)
    self._rounding_seed = rounding_seed
    self._saturate_restores = saturate_restores
    self._rounding: narrow.Rounding | None = None

  def create(self, tracker: base.Tracker) -> None:
    table, name = self.table, self.name
    shape = (table.vocabulary_size, table.dim)
    rows = row_init.RowInitializer.for_table(table)

    def getter(name, shape, dtype, initializer, trainable):
      del shape  # the custom getter may drop it; use the table's shape
      full = (table.vocabulary_size, table.dim)
      keyed = isinstance(initializer, _RowKeyed)
      variable = tf.Variable(
        # Row-keyed: zeros, then the rows chunk by chunk (no second copy).
        initial_value=functools.partial(
          _initial_value,
          tf.zeros if keyed else initializer,
          full,
          dtype,
          self.name,
          self._saturate_restores,
        ),
        name=name,
        shape=full,
        dtype=dtype,
        trainable=trainable,
      )
      if keyed:
        for component in self.strategy.experimental_local_results(variable):
          initializer.rows.fill(
            component, range(table.vocabulary_size), component.device
          )
      return variable

    def create(var_name, initializer, trainable, dtype=tf.float32):
      # Restore-on-create: a pending checkpoint restore fills the value.
      return tracker.add_variable(
        name=var_name,
        initializer=initializer,
        shape=shape,
        dtype=dtype,
        getter=getter,
        trainable=trainable,
      )

    # A pending restore replaces the initializer with the checkpoint's value.
    params = create(
      name,
      _RowKeyed(rows) if rows is not None else table.initializer,
      True,
      self.dtype,
    )
    slots = {}
    if self.optimizer is not None:
      slots = _tf_internal.create_slots(
        self.optimizer,
        params,
        lambda slot, init: create(f"{name}/{slot}", init, False),
      )
    self._variables = {"parameters": params, **slots}
    if narrow.is_narrow(self.dtype):
      # Per replica, advanced identically by each; not checkpointed.
      counter = narrow.rounding_step_variable(name)
      self._rounding = narrow.Rounding(
        self._rounding_seed,
        counter,
        # Every copy counts the same values: replica 0's count is the table's.
        narrow.saturation_variables(
          name, tf.VariableAggregation.ONLY_FIRST_REPLICA
        ),
      )

  @property
  def parameters(self) -> tf.Variable:
    return self._variables["parameters"]

  def slots(self) -> dict[str, tf.Variable]:
    return {k: v for k, v in self._variables.items() if k != "parameters"}

  def local_variables(self) -> dict[str, tf.Variable] | None:
    if narrow.is_narrow(self.dtype):
      # Not for a tape or the static engine's dense gradient: `gather`
      # upcasts. The fused kernels take them (`kernel_variables`).
      return None
    return self._variables

  def kernel_variables(self) -> dict[str, tf.Variable] | None:
    return self._variables

  @property
  def rounding(self) -> narrow.Rounding | None:
    return self._rounding

  def saturated(self) -> narrow.SaturatedValues | None:
    if self._rounding is None or self._rounding.saturation is None:
      return None
    return narrow.read_saturation(
      self._rounding.saturation, self.strategy, self.dtype
    )

  def reset_rows(self, rows: tf.Tensor) -> Any:
    rows = tf.cast(tf.reshape(rows, [-1]), tf.int64)
    writes = []
    for key, values in self.initial_rows(rows).items():
      variable = self._variables[key]
      values = narrow.cast(values, variable.dtype)
      writes += reset.write_each_copy(self.strategy, variable, rows, values)
    return tf.group(writes)

  def _exchanges(self) -> bool:
    """Whether the update sums touched rows over the replicas now."""
    return (
      self.strategy.num_replicas_in_sync > 1
      and tf.distribute.get_replica_context() is not None
    )

  def updates_alone(self) -> bool:
    return not self._exchanges()

  def update_exchanges(self) -> bool:
    return self._exchanges()

  def gather(
    self,
    ids: tf.Tensor,
    valid: tf.Tensor | None,
    capacity: int | tf.Tensor,
  ) -> tuple[tf.Tensor, Any]:
    del valid, capacity  # invalid slots name real rows too
    # `tf.gather` on the variable: a tape on the table sees IndexedSlices.
    rows = tf.gather(self.parameters, ids)
    if narrow.is_narrow(self.dtype):
      rows = tf.cast(rows, tf.float32)
    return rows, None

  def updates(
    self, step: TableStep, row_grads: tf.Tensor
  ) -> list[optimizers.SparseUpdate]:
    ids, num_unique, rows = step.ids, step.num_unique, step.rows
    keep = None if num_unique is None else num_unique > 0
    if self._exchanges():
      replica_ctx = tf.distribute.get_replica_context()
      if num_unique is not None:
        ids, row_grads, num_unique = _static_sum_across_replicas(
          replica_ctx, ids, num_unique, row_grads, self.table.vocabulary_size
        )
        keep = num_unique > 0
      else:
        if step.capacity is None:
          _warn_dynamic_exchange(self.name)
        ids, row_grads = _sum_across_replicas(
          replica_ctx, ids, row_grads, step.capacity
        )
      rows = None  # other replicas' rows too: gathered by the update
    return [
      optimizers.SparseUpdate(
        self.parameters,
        self.slots(),
        ids,
        row_grads,
        rows,
        keep,
        self._rounding,
      )
    ]


def _initial_value(
  initializer: Any,
  shape: tuple[int, int],
  dtype: tf.DType,
  name: str,
  saturate_restores: bool,
) -> Any:
  """`initializer`'s value in `dtype`; a checkpoint's value (restore on
  create) is cast when it was saved in another dtype (float32 <-> narrow):
  values beyond a narrow dtype's range are refused, or saturated with
  `saturate_restores` (`backends.storage.narrow`)."""
  value = initializer(shape, dtype=narrow.math_dtype(dtype))
  if isinstance(value, _tf_internal.CheckpointInitialValue):
    stored = value.wrapped_value
    if stored.dtype != dtype:
      path = value.checkpoint_position.checkpoint.save_path_string
      _check_range(stored, dtype, name, saturate_restores, path)
      value.wrapped_value = narrow.cast(stored, dtype)
    return value
  return tf.cast(value, dtype)


def _check_range(
  stored: tf.Tensor, dtype: tf.DType, name: str, saturate: bool, path: str
) -> None:
  """Refuses (or, with `saturate`, warns of) a value restored from
  checkpoint `path` with values beyond narrow `dtype`'s range.

  Raises:
    NarrowRangeError: naming the table, the count and the largest value.
  """
  if not narrow.is_narrow(dtype) or stored.dtype.size <= dtype.size:
    return
  count, largest = narrow.saturated(stored, dtype)
  count, largest = int(count), float(largest)
  if not count:
    return
  source = f"checkpoint {path} (restored as the table is created)"
  if not saturate:
    raise narrow.NarrowRangeError(
      narrow.range_message(name, dtype, count, largest, source)
    )
  narrow.warn_saturated_restore(name, dtype.name, count, largest, source)


class _RowKeyed:
  """The table's initializer as `backends.storage.row_init` computes it, per
  row."""

  def __init__(self, rows: row_init.RowInitializer):
    self.rows = rows

  def __call__(self, shape, dtype=tf.float32):
    return tf.zeros(shape, dtype)


def _static_sum_across_replicas(
  replica_ctx,
  ids: tf.Tensor,
  num_unique: tf.Tensor,
  grads: tf.Tensor,
  vocabulary_size: int,
):
  """Every replica's unique rows and gradients, summed per id; fixed sizes.

  Returns `(ids, grads, num_unique)` laid out like `static_bags.dedup`'s
  result over the `R * N` gathered slots: identical on every replica, so
  the replicas' copies of the table stay bit-identical.
  """
  real = tf.range(tf.shape(ids)[0]) < num_unique
  # Slots past `num_unique` travel as id -1: one collective for both.
  all_ids = replica_ctx.all_gather(tf.where(real, ids, -1), axis=0)
  all_real = all_ids >= 0
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


@functools.cache
def _warn_dynamic_exchange(table_name: str) -> None:
  log.warning(
    "table %r: the touched rows exchanged between replicas have no static "
    "size (a batch of unknown size, or a sparse/ragged feature without a "
    "static width). Several steps in one tf.function loop then fail under "
    "MirroredStrategy ('Shape mismatch in the collective instance'): batch "
    "with drop_remainder=True, and give sparse/ragged features the "
    "backend's bag_widths option (then preprocess() in the input pipeline).",
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
