"""Parameter-server storage: row ranges on the servers of a PS strategy.

Under `tf.distribute.experimental.ParameterServerStrategy`, a variable created
in `strategy.scope()` becomes a `ShardedVariable` when the strategy's
`variable_partitioner` splits it: contiguous row ranges ("div" partitioning,
the first `V % N` shards one row longer) on different parameter servers.
Each table is built that way (`TablePartitioner` splits tables and nothing
else), and each optimizer slot shard by shard next to the table shard it
belongs to (same rows, same parameter server), so a row's weights and slots
always live together.

A step's unique rows are gathered from the shards that own them (only the
touched rows cross the network), and each unique row's gradient (summed
over the worker's batch; workers are asynchronous, no all-reduce) is sent
to its shard's parameter server, which applies the table's TPU-semantics
optimizer to its table and slot shards in place.

A `ShardedVariable` saves its shards as slices of one full tensor: the
checkpoint holds TF's full `<table>` / `<table>.S<slot>`.

Example:
  >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
  ...     resolver, variable_partitioner=TablePartitioner(num_shards=2))
"""

import contextlib
import functools
import logging
import threading
from typing import Any

import tensorflow as tf

from backends import _tf_internal, hardware, optimizers
from backends.storage import base, row_init, row_layout
from backends.table_step import TableStep

log = logging.getLogger("recsys.backends")

_BUILDING = threading.local()


@contextlib.contextmanager
def building_tables():
  """Marks variable creation as "an embedding table" for `TablePartitioner`."""
  previous = getattr(_BUILDING, "active", False)
  _BUILDING.active = True
  try:
    yield
  finally:
    _BUILDING.active = previous


class TablePartitioner:
  """A `variable_partitioner` that shards embedding tables and nothing else.

  `ParameterServerStrategy` calls its `variable_partitioner` for every
  variable created in its scope. This one splits the tables that the
  parameter_servers backend builds into `num_shards` row ranges (fewer if a
  shard would hold less than `min_shard_bytes`, never more than the table's
  rows) and leaves every other variable (the dense model, the optimizers,
  metrics) whole, so Keras layers never see a `ShardedVariable`.

  Args:
    num_shards: the most shards per table, usually the number of parameter
      servers.
    min_shard_bytes: a table shard holds at least this many bytes (0: always
      `num_shards` shards).

  Example:
    >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
    ...     resolver, variable_partitioner=TablePartitioner(2))
  """

  def __init__(self, num_shards: int, min_shard_bytes: int = 0):
    if int(num_shards) < 1:
      raise ValueError(
        f"TablePartitioner(num_shards={num_shards!r}): need >= 1."
      )
    self.num_shards = int(num_shards)
    self.min_shard_bytes = int(min_shard_bytes)

  def __call__(
    self, shape: tf.TensorShape, dtype: tf.dtypes.DType, axis: int = 0
  ) -> list[int]:
    partitions = [1] * len(shape)
    if not getattr(_BUILDING, "active", False) or not len(shape):
      return partitions
    shards = self.num_shards
    if self.min_shard_bytes > 0:
      total = shape.num_elements() * tf.as_dtype(dtype).size
      shards = max(1, min(shards, total // self.min_shard_bytes))
    partitions[axis] = max(1, min(shards, int(shape[axis])))
    return partitions

  def __repr__(self) -> str:
    return (
      f"TablePartitioner(num_shards={self.num_shards}, "
      f"min_shard_bytes={self.min_shard_bytes})"
    )


def shards_of(variable: tf.Variable) -> list[tf.Variable]:
  """The shard variables of a table (one, if it is not sharded)."""
  if isinstance(variable, _tf_internal.ShardedVariable):
    return list(variable.variables)
  return [variable]


def shard_offsets(variable: tf.Variable) -> list[int]:
  """First row of each shard, then the row count: `[0, n0, n0 + n1, ..., V]`."""
  offsets = [0]
  for shard in shards_of(variable):
    offsets.append(offsets[-1] + int(shard.shape[0]))
  return offsets


class ParameterServers(base.TableStorage):
  """A table and its slots in row ranges on the parameter servers."""

  placement = "parameter_servers"

  def create(self, tracker: base.Tracker) -> None:
    table, name = self.table, self.name
    shape = (table.vocabulary_size, table.dim)
    # Row-keyed initial values: a shard computes only its own rows, the same
    # values as any other backend and placement (`backends.storage.row_init`).
    rows = row_init.RowInitializer.for_table(table)

    def table_getter(name, shape, dtype, initializer, trainable):
      del shape
      with building_tables():
        return tf.Variable(
          initial_value=_partition_aware(
            initializer, (table.vocabulary_size, table.dim), dtype, rows
          ),
          name=name,
          shape=(table.vocabulary_size, table.dim),
          dtype=dtype,
          trainable=trainable,
        )

    params = tracker.add_variable(
      name=name,
      initializer=table.initializer,
      shape=shape,
      dtype=tf.float32,
      getter=table_getter,
      trainable=True,
    )
    variables = {"parameters": params}
    for slot, init in optimizers.slot_initializers(self.optimizer).items():

      def slot_getter(name, shape, dtype, initializer, trainable):
        del shape
        return self._colocated_like(params, name, initializer, dtype, trainable)

      variables[slot] = tracker.add_variable(
        name=f"{name}/{slot}",
        initializer=init,
        shape=shape,
        dtype=tf.float32,
        getter=slot_getter,
        trainable=False,
      )
    self._variables = variables
    self.layout = row_layout.ContiguousRows(shard_offsets(params))
    self._log_shards()

  def _log_shards(self) -> None:
    params = self.parameters
    shards = shards_of(params)
    log.info(
      "table %r %s: %d shard(s) of rows %s on %s",
      self.name,
      params.shape.as_list(),
      len(shards),
      shard_offsets(params),
      ", ".join(s.device for s in shards),
    )
    num_ps = max(1, hardware.num_tasks(self.strategy, "ps"))
    if len(shards) == 1 and num_ps > 1:
      log.warning(
        "table %r is not sharded: it lives whole on %s. Build the "
        "ParameterServerStrategy with variable_partitioner="
        "backends.parameter_servers.backend.TablePartitioner(%d) to split "
        "tables over the "
        "%d parameter servers.",
        self.name,
        shards[0].device,
        num_ps,
        num_ps,
      )

  def _colocated_like(self, params, name, initializer, dtype, trainable):
    """A variable partitioned like `params`, each shard next to its shard."""
    parts = []
    offsets = shard_offsets(params)
    full = params.shape.as_list()
    for i, shard in enumerate(shards_of(params)):
      rows = offsets[i + 1] - offsets[i]
      init = _shard_value(initializer, full, rows, offsets[i], dtype)
      with self.strategy.extended.colocate_vars_with(shard):
        parts.append(
          tf.Variable(
            initial_value=init,
            shape=(rows,) + tuple(full[1:]),
            dtype=dtype,
            name=(f"{name}/part_{i}" if len(offsets) > 2 else name),
            trainable=trainable,
          )
        )
    if len(parts) == 1:
      return parts[0]
    return _tf_internal.ShardedVariable(parts, name=name)

  @property
  def parameters(self) -> tf.Variable:
    return self._variables["parameters"]

  def slots(self) -> dict[str, tf.Variable]:
    return {k: v for k, v in self._variables.items() if k != "parameters"}

  def devices(self) -> list[str]:
    """The parameter-server device of each shard of the table."""
    return [s.device for s in shards_of(self.parameters)]

  def reset_rows(self, rows: tf.Tensor) -> Any:
    """Each shard's parameter server writes the starting values of the
    rows it owns (from a worker's step or the coordinator)."""
    rows = tf.cast(tf.reshape(rows, [-1]), tf.int64)
    writes = []
    for key, values in self.initial_rows(rows).items():
      shards = list(enumerate(shards_of(self._variables[key])))
      writes += row_layout.write_rows(self.layout, shards, rows, values)
    return tf.group(writes)

  def gather(
    self,
    ids: tf.Tensor,
    valid: tf.Tensor | None,
    capacity: int | tf.Tensor,
  ) -> tuple[tf.Tensor, Any]:
    del valid, capacity
    return row_layout.gather(self.layout, shards_of(self.parameters), ids), None

  def updates(
    self, step: TableStep, row_grads: tf.Tensor
  ) -> list[optimizers.SparseUpdate]:
    """Applies the update on the parameter servers owning the rows.

    Each unique row's gradient is summed over this worker's batch (no
    all-reduce: workers are asynchronous) and sent to its shard.
    """
    ids, num_unique = step.ids, step.num_unique
    if num_unique is not None:
      ids, row_grads = ids[:num_unique], row_grads[:num_unique]
    row_layout.apply(
      self.optimizer,
      self.layout,
      shards_of(self.parameters),
      {k: shards_of(v) for k, v in self.slots().items()},
      ids,
      row_grads,
    )
    return []


def _partition_aware(initializer, full_shape, dtype, rows=None):
  """An `initial_value` the strategy can call per partition (or whole).

  `rows`: the table's `RowInitializer`, used instead of `initializer`.
  """
  if isinstance(initializer, _tf_internal.CheckpointInitialValueCallable):
    # Restore on create: the strategy passes each shard's `shard_info`, the
    # callable reads that slice of the full tensor.
    return functools.partial(initializer, shape=tuple(full_shape), dtype=dtype)

  def initial_value(partition_shape=None, partition_offset=None):
    if rows is not None:
      first = int(partition_offset[0]) if partition_offset else 0
      count = int((partition_shape or full_shape)[0])
      return rows.rows(tf.range(first, first + count, dtype=tf.int64))
    init = initializer
    if partition_offset is not None and partition_offset[0]:
      init = _reseeded_for_rows(initializer, int(partition_offset[0]))
    return init(tuple(partition_shape or full_shape), dtype=dtype)

  return initial_value


def _reseeded_for_rows(initializer, first_row: int):
  """A seeded Keras initializer's copy for the shard starting at `first_row`.

  A seeded initializer returns the same values for the same shape: without
  this, shards of equal size would start identical.
  """
  get_config = getattr(initializer, "get_config", None)
  config = get_config() if callable(get_config) else {}
  if config.get("seed") is None:
    return initializer
  seed = (int(config["seed"]) + 1_000_003 * first_row) % (1 << 31)
  return type(initializer).from_config({**config, "seed": seed})


def _shard_value(initializer, full_shape, rows, offset, dtype):
  """The initial value of one shard: its checkpoint slice or a fresh value."""
  shape = (rows,) + tuple(full_shape[1:])
  if isinstance(initializer, _tf_internal.CheckpointInitialValueCallable):
    info = _tf_internal.ShardInfo(
      shape=tf.TensorShape(shape), offset=(offset,) + (0,) * (len(shape) - 1)
    )
    return lambda: initializer(shape=tuple(full_shape), shard_info=info)
  return lambda: initializer(shape, dtype=dtype)
