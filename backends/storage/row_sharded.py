"""Row-sharded storage: each replica owns a slice of a table's rows and slots.

A table too big for one device is split over the replicas of the strategy
(`MirroredStrategy`, `MultiWorkerMirroredStrategy`, `TPUStrategy`): replica
`r` of `R` holds the rows of its `RowLayout` (`strided`: ids `r, r + R, ...`,
the default; or `contiguous` ranges) and those rows' optimizer slots, in
equal-sized shards of `S = ceil(V / R)` rows.

Storage is TF's own per-replica variable: one `tf.Variable` created with
`synchronization=ON_READ` under the strategy's scope, a `SyncOnReadVariable`
(TPU: `TPUSyncOnReadVariable`) whose component on each replica's device is
that replica's shard. Inside a replica step its `handle` is the local
shard's, so the step reads and writes its own rows with the ordinary
resource ops (and the fused CPU kernels), on every strategy alike. Its
aggregation is NONE: no cross-replica read can silently sum the shards;
`RowShardedVariable` reads and saves the full table instead.

One step of one table, with static shapes (the same on every replica and
every step, as collectives in a compiled program need), through the
collectives the replica context offers (`all_gather`, `all_reduce`):

1. lookup: every replica's `C` unique ids are all-gathered (`[R * C]`);
   each owner gathers the rows it owns (zeros elsewhere) and an
   all-reduce sums them, of which each replica keeps its own `C` rows (XLA
   turns an all-reduce sliced by replica id into a reduce-scatter);
2. update: the row gradients are all-gathered (`[R * C, D]`); each owner
   sums those of its rows over every replica (one static de-duplication of
   its local rows) and applies the table's optimizer — the TPU optimizer
   math of `backends.optimizers` — to its own rows and slots only.

A narrow table (`dtype` bfloat16 or float16, `backends.storage.narrow`) keeps
its shards in that dtype and its slots float32: the owners upcast the rows
they send, and round their updated rows back stochastically with the
replicated table's draws, keyed by each row's GLOBAL id (`ShardRounding`):
any number of replicas and either layout give the same bits as one
replicated table.

Checkpoints hold the full `<table>` and `<table>/<slot>` tensors (TF's
mid-level layout): `RowShardedVariable` assembles them from the shards when
saving and splits them when restoring, so a run moves between any number of
replicas, row-sharded or replicated, and into `TPUEmbeddingForServing`.

Example:
  >>> storage = RowSharded(table, "items", Adagrad(0.1), strategy)
  >>> with strategy.scope():
  ...   storage.create(tracker)
  >>> # in a replica step: rows, exchanged = storage.gather(ids, valid, C)
"""

import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from backends import _tf_internal, optimizers, placement
from backends import base as backends_base
from backends.storage import base, narrow, row_init, row_layout
from backends.storage import exchange as exchange_lib
from backends.table_step import TableStep

log = logging.getLogger("recsys.backends")

#: The default row layout (docs/scaling.md): contiguous shards are saved and
#: restored as row slices where they live, never assembled whole.
DEFAULT_ROW_LAYOUT = placement.DEFAULT_ROW_LAYOUT


def local_replica_ids(strategy: tf.distribute.Strategy) -> list[int]:
  """Each local replica's id in the sync group, in local-results order.

  On a MultiWorkerMirroredStrategy a worker holds only its own replicas'
  components; their global ids say which shards those are.
  """
  ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: ctx.replica_id_in_sync_group
  )
  return [int(i) for i in strategy.experimental_local_results(ids)]


def _shard(
  layout: row_layout.RowLayout, full: tf.Tensor, shard: int, size: int
):
  """Shard `shard` of a full `[V, D]` table, padded to `size` rows."""
  if isinstance(layout, row_layout.StridedRows):
    rows = full[shard :: layout.num_shards]
  else:
    rows = full[shard * size : (shard + 1) * size]
  return tf.pad(rows, [[0, size - tf.shape(rows)[0]], [0, 0]])


class RowShardedVariable(_tf_internal.Trackable):
  """One row-sharded table or slot, read and saved as its full `[V, D]` value.

  Wraps the per-replica `SyncOnReadVariable` of shards. It converts to the
  full tensor (`tf.convert_to_tensor`, `read_value`, `numpy`), assigns a
  full tensor to the shards, and is a checkpoint child whose one entry is
  the full tensor under TF's variable key, so its checkpoints are those of
  a replicated table.

  Args:
    shards: the `ON_READ` variable of `[S, D]` shards.
    layout: which rows each shard holds.
    strategy: the strategy it was created under.
  """

  def __init__(
    self,
    shards: tf.Variable,
    layout: row_layout.RowLayout,
    strategy: tf.distribute.Strategy,
  ):
    self.shards = shards
    self.layout = layout
    self._strategy = strategy
    self.shard_rows = int(shards.shape[0])

  @property
  def shape(self) -> tf.TensorShape:
    return tf.TensorShape(
      [self.layout.vocabulary_size, int(self.shards.shape[1])]
    )

  @property
  def dtype(self) -> tf.DType:
    return self.shards.dtype

  @property
  def name(self) -> str:
    return self.shards.name

  def local_shards(self) -> list[tuple[int, tf.Variable]]:
    """`(shard index, variable)` of the shards on this worker."""
    if self.layout.num_shards == 1:
      return [(0, self._only())]
    components = self._strategy.experimental_local_results(self.shards)
    return list(zip(local_replica_ids(self._strategy), components))

  def _only(self) -> tf.Variable:
    """The one shard of a single-replica table."""
    values = getattr(self.shards, "values", None)
    return values[0] if values else self.shards

  def read_value(self) -> tf.Tensor:
    """The full `[V, D]` table (collects every replica's shard)."""
    if self.layout.num_shards == 1:
      return tf.identity(self._only())[: self.layout.vocabulary_size]
    ctx = tf.distribute.get_replica_context()
    shards = self.local_shards()
    if ctx is not None and ctx.strategy is self._strategy:
      local = tf.raw_ops.ReadVariableOp(
        resource=self.shards.handle, dtype=self.dtype
      )
      stacked = ctx.all_gather(local, axis=0)
    elif len(shards) == self.layout.num_shards:  # all here: no collective
      stacked = tf.concat([tf.identity(v) for _, v in sorted(shards)], 0)
    else:  # other workers hold some: gathered from every replica
      stacked = self._strategy.gather(self.shards, axis=0)
    stacked = tf.reshape(
      stacked, [self.layout.num_shards, self.shard_rows, self.shape[1]]
    )
    return row_layout.to_full(self.layout, stacked)

  value = read_value

  def numpy(self):
    return self.read_value().numpy()

  def assign(self, full: Any) -> Any:
    """Sets every local shard from a full `[V, D]` value (cast to the
    shards' dtype: a float32 value into a narrow table rounds to nearest,
    saturated at its range, `narrow.cast`); returns the ops."""
    full = tf.convert_to_tensor(full)
    if full.dtype != self.dtype:
      full = narrow.cast(full, self.dtype)
    if not full.shape.is_compatible_with(self.shape):
      raise ValueError(
        f"{self.name}: cannot assign a value of shape {full.shape} to a "
        f"table of shape {self.shape}."
      )
    ops = []
    for index, shard in self.local_shards():
      with tf.device(shard.device):
        ops.append(
          shard.assign(_shard(self.layout, full, index, self.shard_rows))
        )
    return tf.group(*ops) if not tf.executing_eagerly() else None

  # -- checkpoints ---------------------------------------------------------

  def saves_slices(self) -> bool:
    """Whether checkpoints hold this table as row slices, shard by shard.

    Contiguous shards are row ranges of TF's full `[V, D]` tensor: each is
    saved where it lives as slices of the full tensor (TF's save-slice
    mechanism), never assembled. A strided shard is no range: the table is
    assembled whole to be saved.
    """
    return isinstance(self.layout, row_layout.ContiguousRows)

  def local_chunks(self) -> list[tuple[str, int, int, tf.Variable, int]]:
    """This worker's rows as row chunks of its shards.

    Each is `(slice spec, first table row, rows, shard, first shard row)`;
    a chunk holds at most `row_init.CHUNK_BYTES`, which bounds what saving,
    restoring, and restoring into another layout hold at once.
    """
    vocab, dim = self.shape.as_list()
    step = row_init.rows_per_chunk(dim, self.dtype)
    out = []
    for index, shard in self.local_shards():
      rows = self.layout.rows_in(index)
      for local in range(0, len(rows), step):
        count = min(step, len(rows) - local)
        begin = rows.start + local
        out.append(
          (slice_spec(vocab, dim, begin, count), begin, count, shard, local)
        )
    return out

  saved_chunks = local_chunks  # each worker saves the rows it owns

  def read_chunk(self, shard: tf.Variable, local: int, count: int):
    """Rows `[local, local + count)` of a shard: a gather, not a whole read.

    (TF copies a sparsely updated variable whole on every read.)
    """
    return read_rows_of(shard, local, count)

  def _serialize_to_tensors(self) -> dict[str, Any]:
    key = _tf_internal.VARIABLE_VALUE_KEY
    if self.saves_slices() and _ROWS_OUTSIDE_TF.restore:
      return {}  # read chunk by chunk (backends.storage.row_sharded_checkpoint)
    if self.saves_slices() and _ROWS_OUTSIDE_TF.save:
      # The key is recorded in the object graph; the rows written apart.
      device = self.local_shards()[0][1].device  # grouped with its task
      return {
        key: _tf_internal.SaveSpec(
          lambda: None, "", "", dtype=self.dtype, device=device
        )
      }
    # TF's own save and restore (a user's tf.train.Checkpoint): the table
    # whole, as a replicated one (TF restores several slices of one
    # trackable's key as if they were one).
    with tf.device("/cpu:0"):
      return {key: self.read_value()}

  def _restore_from_tensors(self, restored_tensors: dict[str, Any]):
    return self.assign(restored_tensors[_tf_internal.VARIABLE_VALUE_KEY])

  def assign_rows(self, begin: int, rows: Any) -> None:
    """Assigns table rows `[begin, begin + len(rows))` to the local shards.

    Only the rows a local shard owns are written, by a scatter (a slice
    assignment would copy a sparsely updated variable whole).
    """
    rows = tf.convert_to_tensor(rows, self.dtype)
    end = begin + int(rows.shape[0])
    for index, shard in self.local_shards():
      mine = self.layout.rows_in(index)
      first = max(mine.start, begin + (mine.start - begin) % mine.step)
      picked = range(first, min(end, mine.stop), mine.step)
      if not len(picked):
        continue
      local = (picked.start - mine.start) // mine.step
      with tf.device(shard.device):
        shard.scatter_update(
          tf.IndexedSlices(
            rows[picked.start - begin : picked.stop - begin : mine.step],
            tf.range(local, local + len(picked), dtype=tf.int64),
          )
        )

  def __repr__(self) -> str:
    return (
      f"<RowShardedVariable {self.name!r} shape={self.shape.as_list()} "
      f"{self.layout.num_shards} shards of {self.shard_rows} rows "
      f"({self.layout.name})>"
    )


tf.register_tensor_conversion_function(
  RowShardedVariable,
  lambda value, dtype=None, name=None, as_ref=False: tf.cast(
    value.read_value(), dtype or value.dtype
  ),
)


class _RowsOutsideTF(threading.local):
  save = False
  restore = False


_ROWS_OUTSIDE_TF = _RowsOutsideTF()


@contextlib.contextmanager
def rows_outside_tf(save: bool = False, restore: bool = False):
  """TF's save or restore leaves sliced tables' rows to the caller.

  Saving records each table's checkpoint key but writes none of its rows;
  restoring skips them: `backends.storage.row_sharded_checkpoint` writes and
  reads them chunk by chunk, where TF would hold every tensor of a checkpoint at
  once.
  """
  previous = (_ROWS_OUTSIDE_TF.save, _ROWS_OUTSIDE_TF.restore)
  _ROWS_OUTSIDE_TF.save, _ROWS_OUTSIDE_TF.restore = save, restore
  try:
    yield
  finally:
    _ROWS_OUTSIDE_TF.save, _ROWS_OUTSIDE_TF.restore = previous


def rows_left_outside() -> tuple[bool, bool]:
  """`(save, restore)`: whether TF's save or restore now leaves sliced
  state to `backends.storage.row_sharded_checkpoint` (`rows_outside_tf`),
  for other objects saved by slices (a sharded vocabulary index)."""
  return _ROWS_OUTSIDE_TF.save, _ROWS_OUTSIDE_TF.restore


def read_rows_of(variable: tf.Variable, begin: int, count: int) -> tf.Tensor:
  """Rows `[begin, begin + count)` of one variable on its device: a gather,
  not a whole read (TF copies a sparsely updated variable whole on every
  read)."""
  with tf.device(variable.device):
    return tf.raw_ops.ResourceGather(
      resource=variable.handle,
      indices=tf.range(begin, begin + count, dtype=tf.int64),
      dtype=variable.dtype,
    )


def slice_spec(vocab: int, dim: int, begin: int, rows: int) -> str:
  """TF's slice spec of rows `[begin, begin + rows)` of a `[vocab, dim]`."""
  return f"{vocab} {dim} {begin},{rows}:-"


def parse_slice_spec(spec: str) -> tuple[int, int]:
  """`(first row, rows)` of a `slice_spec` (rows slices only)."""
  rows = spec.split()[-1].split(":")[0]
  begin, count = rows.split(",")
  return int(begin), int(count)


def check_optimizer(table_name: str, optimizer: Any) -> None:
  """Refuses what a row-sharded table cannot honour: whole-table slots.

  Raises:
    UnsupportedConfigError: the optimizer has a `slot_variable_creation_fn`.
  """
  if optimizer is not None and optimizer.slot_variable_creation_fn:
    raise backends_base.UnsupportedConfigError(
      f"table {table_name!r}: its optimizer has a slot_variable_creation_fn, "
      "which creates whole-table slots; a row-sharded table creates its "
      "slots shard by shard. Drop slot_variable_creation_fn or place the "
      "table 'replicated'."
    )


@dataclasses.dataclass
class ShardRounding(narrow.Rounding):
  """One shard's stochastic rounding at one update step.

  The draws are the replicated table's (`narrow.random_bits` of the seed,
  the update step and the row), keyed by each row's GLOBAL id: a shard's
  local row ids are mapped back through the layout, so the table's bits do
  not depend on how many replicas hold it. `step` is the table's update
  count, advanced once per update by the caller (every shard of a host
  update shares it); `counter` is unused. `saturation` counts the values
  the shard's update saturates (the shard's own component of the table's
  per-replica counters).

  Attributes:
    layout: the table's row layout.
    shard: the shard's index (an int, or the replica id tensor).
    step: int64 scalar tensor, this update's step.
  """

  layout: Any = None
  shard: Any = 0
  step: Any = None
  # The kernels would key the draws by the shard's local row ids.
  fused: bool = dataclasses.field(default=False, init=False)

  def round(self, values: tf.Tensor, dtype: tf.DType, ids: tf.Tensor):
    self.count_saturated(values, dtype, ids)
    rows = self.layout.global_ids(self.shard, ids)
    bits = narrow.random_bits(self.seed, self.step, rows, int(values.shape[-1]))
    return narrow.round_stochastically(values, dtype, bits)


class RowSharded(base.TableStorage):
  """Each replica holds `ceil(V / R)` rows of the table and their slots.

  Args:
    table, name, optimizer, strategy: as `TableStorage`.
    layout: "contiguous" (equal row ranges, default) or "strided" (row id
      mod R).
    exchange: how a step's replicas exchange ids, rows and gradients:
      "all_to_all" (each id to its owner only; default) or "all_gather"
      (`backends.storage.exchange`).
    exchange_sigmas: the all-to-all's margin per owner over the even
      share, in standard deviations (`exchange.owner_capacity`).
    dtype: the rows' dtype: float32, or bfloat16/float16 (narrow).
    rounding_seed: a narrow table's rounding seed (`narrow.table_seed`).
  """

  placement = "row_sharded"

  def __init__(
    self,
    table: Any,
    name: str,
    optimizer: Any,
    strategy: tf.distribute.Strategy,
    layout: str = DEFAULT_ROW_LAYOUT,
    exchange: str = exchange_lib.ALL_TO_ALL,
    exchange_sigmas: float = exchange_lib.CAPACITY_SIGMAS,
    dtype: str = "float32",
    rounding_seed: int = 0,
  ):
    super().__init__(table, name, optimizer, strategy)
    self.dtype = tf.as_dtype(dtype)
    self._rounding_seed = rounding_seed
    self._rounding_step: tf.Variable | None = None
    self._saturation: narrow.Saturation | None = None
    self.layout = row_layout.make(
      layout, table.vocabulary_size, strategy.num_replicas_in_sync
    )
    check_optimizer(name, optimizer)
    if exchange not in exchange_lib.EXCHANGES:
      raise ValueError(
        f"table {name!r}: exchange={exchange!r}; use one of "
        f"{', '.join(exchange_lib.EXCHANGES)}."
      )
    self.exchange = exchange
    self.exchange_sigmas = float(exchange_sigmas)
    self._overflow: tf.Variable | None = None
    self._fused_ops: Any = None

  def use_fused_ops(self, fused_ops: Any) -> None:
    self._fused_ops = fused_ops  # the all-to-all's buckets in one op

  # -- variables -------------------------------------------------------------

  def create(self, tracker: base.Tracker) -> None:
    table = self.table
    size = -(-table.vocabulary_size // self.layout.num_shards)
    shape = (size, table.dim)

    def sharded(var_name, value, dtype=tf.float32):
      variable = tf.Variable(
        initial_value=value,
        name=var_name,
        shape=shape,
        dtype=dtype,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.NONE,
      )
      return RowShardedVariable(variable, self.layout, self.strategy)

    if self.exchange == exchange_lib.ALL_TO_ALL:
      # Overflowed ids per replica, counted by compiled steps (not saved).
      self._overflow = tf.Variable(
        tf.constant(0, tf.int64),
        trainable=False,
        name=f"{self.name}/exchange_overflow",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
      )
    with _tf_internal.worker_local_initial_values(self.strategy):
      params = sharded(
        self.name, functools.partial(tf.zeros, shape, self.dtype), self.dtype
      )
    rows = row_init.RowInitializer.for_table(table)
    if rows is not None:
      # Each replica its own rows, chunk by chunk: the values of a row do
      # not depend on the layout, and no process draws the whole table.
      for index, shard in params.local_shards():
        rows.fill(shard, self.layout.rows_in(index), shard.device)
    else:
      _warn_whole_table_init(self.name, table.initializer)
      with tf.device("/cpu:0"):
        params.assign(
          table.initializer(
            (table.vocabulary_size, table.dim), dtype=tf.float32
          )
        )
    self._params = params
    if narrow.is_narrow(self.dtype):
      # The table's updates so far, per replica, each advanced identically
      # (as a replicated narrow table's; not checkpointed).
      self._rounding_step = narrow.rounding_step_variable(self.name)
      # Each owner counts the values its rows' updates saturate: summed.
      self._saturation = narrow.saturation_variables(
        self.name, tf.VariableAggregation.SUM
      )
    self._slots = {}
    if self.optimizer is not None:
      for slot, init in optimizers.slot_initializers(self.optimizer).items():
        with _tf_internal.worker_local_initial_values(self.strategy):
          self._slots[slot] = sharded(
            f"{self.name}/{slot}", functools.partial(init, shape, tf.float32)
          )
    # Tracked after creation: a pending checkpoint restore assigns them.
    tracker.add_trackable(self.name, params)
    for slot, variable in self._slots.items():
      tracker.add_trackable(f"{self.name}/{slot}", variable)
    log.info(
      "table %r [%d, %d]: row-sharded over %d replicas (%s rows), %d rows "
      "and %d slot(s) per replica",
      self.name,
      table.vocabulary_size,
      table.dim,
      self.layout.num_shards,
      self.layout.name,
      size,
      len(self._slots),
    )

  @property
  def parameters(self) -> RowShardedVariable:
    return self._params

  def slots(self) -> dict[str, RowShardedVariable]:
    return dict(self._slots)

  def reset_rows(self, rows: tf.Tensor) -> Any:
    rows = tf.cast(tf.reshape(rows, [-1]), tf.int64)
    variables = {"parameters": self._params, **self._slots}
    writes = []
    for key, values in self.initial_rows(rows).items():
      variable = variables[key]
      values = narrow.cast(values, variable.dtype)
      # Each shard on this worker writes the rows it owns.
      writes += row_layout.write_rows(
        self.layout, variable.local_shards(), rows, values
      )
    return tf.group(writes)

  def shard_variables(self) -> dict[str, tf.Variable]:
    """The per-replica shard variables: "parameters" and each slot."""
    return {
      "parameters": self._params.shards,
      **{k: v.shards for k, v in self._slots.items()},
    }

  # -- a step --------------------------------------------------------------

  def _replica_context(self):
    """This strategy's replica context, or None in cross-replica context."""
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.strategy is self.strategy:
      return ctx
    return None

  def update_exchanges(self) -> bool:
    return self._replica_context() is not None

  def gather(
    self,
    ids: tf.Tensor,
    valid: tf.Tensor | None,
    capacity: int | tf.Tensor,
  ) -> tuple[tf.Tensor, Any]:
    ctx = self._replica_context()
    if ctx is None:
      return self._gather_on_host(ids), None
    exchange = self._exchange_for(capacity)
    real = tf.ones_like(ids, tf.bool) if valid is None else valid
    rows, record = exchange.lookup(
      ctx, self._params.shards, ids, real, capacity, self.name
    )
    with tf.control_dependencies(self._overflow_checks(exchange, record)):
      rows = tf.identity(rows[: tf.shape(ids)[0]])
    return rows, (exchange, record)

  def _overflow_checks(self, exchange: exchange_lib.Exchange, record) -> list:
    """What makes an overflowed all-to-all fail: an assertion to depend on
    (uncompiled steps), or the count the host raises for after the step."""
    deps = exchange_lib.check_overflow(exchange, record, self.name)
    if isinstance(exchange, exchange_lib.AllToAll) and not deps:
      # A compiled step cannot raise: the host does, after the step.
      assert self._overflow is not None  # made with the all-to-all
      self._overflow.assign_add(exchange.overflow(record))
    return deps

  def _exchange_for(self, capacity: int | tf.Tensor) -> exchange_lib.Exchange:
    """This step's exchange: all-to-all needs a static number of ids, and
    a traced step (eager replicas run one at a time: collectives of their
    own would wait for each other forever)."""
    if (
      self.exchange == exchange_lib.ALL_TO_ALL
      and isinstance(capacity, int)
      and not tf.executing_eagerly()
    ):
      return exchange_lib.AllToAll(
        self.layout,
        exchange_lib.owner_capacity(
          capacity, self.layout.num_shards, self.exchange_sigmas
        ),
        self._fused_ops,
      )
    if self.exchange == exchange_lib.ALL_TO_ALL and not isinstance(
      capacity, int
    ):
      _warn_dynamic_all_to_all(self.name)
    return exchange_lib.AllGather(self.layout)

  def raise_for_overflow(self) -> None:
    """Raises if a compiled step overflowed the exchange; resets the count.

    Raises:
      ExchangeOverflowError: naming the table and the capacity to raise.
    """
    if self._overflow is None:
      return
    over = int(self._overflow.numpy())
    if not over:
      return
    for local in self.strategy.experimental_local_results(self._overflow):
      local.assign(tf.zeros_like(local))
    raise exchange_lib.ExchangeOverflowError(
      f"table {self.name!r}: a compiled step sent {over} ids more than the "
      "all-to-all exchange's capacity per owner (summed over the replicas); "
      "those rows were left out. Raise EmbeddingPlacement.exchange_sigmas, "
      "place the table with EmbeddingPlacement.row_layout = 'strided', or "
      "use EmbeddingPlacement.exchange = 'all_gather'. Nothing was saved "
      "after the step."
    )

  def _gather_on_host(self, ids: tf.Tensor) -> tf.Tensor:
    """Rows of `ids` in cross-replica context, from the shards directly."""
    shards = self._params.local_shards()
    if len(shards) == self.layout.num_shards:
      ordered = [v for _, v in sorted(shards, key=lambda s: s[0])]
      return row_layout.gather(self.layout, ordered, ids)
    _warn_full_read(self.name)
    rows = tf.gather(self._params.read_value(), ids)
    return tf.cast(rows, narrow.math_dtype(self.dtype))

  def updates(
    self, step: TableStep, row_grads: tf.Tensor
  ) -> list[optimizers.SparseUpdate]:
    # The owners gather their own rows: `step.rows` are other owners' too.
    ctx = self._replica_context()
    if ctx is None:
      self._apply_on_host(step.ids, step.num_unique, row_grads)
      return []
    if step.exchanged is not None:
      exchange, record = step.exchanged  # as the lookup exchanged them
    else:  # rows of its own (`backends.gradient_rows`): routed afresh
      size = tf.shape(step.ids)[0]
      capacity = step.capacity if step.capacity is not None else size
      exchange = self._exchange_for(capacity)
      valid = (
        tf.range(size) < step.num_unique
        if step.num_unique is not None
        else tf.ones([size], tf.bool)
      )
      record = exchange.route_ids(ctx, step.ids, valid, capacity, self.name)
      with tf.control_dependencies(self._overflow_checks(exchange, record)):
        row_grads = tf.identity(row_grads)
    local, owned, grads = exchange.gradients(ctx, record, row_grads)
    variables = self.shard_variables()
    table = variables.pop("parameters")
    rounding = self._update_rounding()
    return exchange_lib.owner_updates(
      table,
      variables,
      local,
      owned,
      grads,
      self._params.shard_rows,
      static=step.num_unique is not None,
      rounding=rounding(ctx.replica_id_in_sync_group) if rounding else None,
    )

  def _update_rounding(self) -> Callable[[Any], ShardRounding] | None:
    """Shard index -> its rounding for this update, the table's step
    advanced once here; None for a float32 table.

    A shard index is the replica's id tensor in a replica step (the
    counters' local component is the replica's), or an int on the host
    (the counters' component of that shard)."""
    if self._rounding_step is None:
      return None
    counter = self._rounding_step
    with tf.control_dependencies([counter.assign_add(1, read_value=False)]):
      step = tf.identity(counter.read_value())

    def rounding(shard: Any) -> ShardRounding:
      return ShardRounding(
        self._rounding_seed,
        None,
        self._shard_saturation(shard),
        layout=self.layout,
        shard=shard,
        step=step,
      )

    return rounding

  def _shard_saturation(self, shard: Any) -> narrow.Saturation | None:
    """The saturation counters shard `shard`'s update adds to."""
    saturation = self._saturation
    if saturation is None or not isinstance(shard, int):
      return saturation
    components = dict(
      zip(
        local_replica_ids(self.strategy),
        zip(
          self.strategy.experimental_local_results(saturation.count),
          self.strategy.experimental_local_results(saturation.largest),
        ),
      )
    )
    return narrow.Saturation(*components[shard])

  def saturated(self) -> narrow.SaturatedValues | None:
    if self._saturation is None:
      return None
    return narrow.read_saturation(self._saturation, self.strategy, self.dtype)

  def _apply_on_host(
    self, ids: tf.Tensor, num_unique: tf.Tensor | None, grads: tf.Tensor
  ) -> None:
    """The update in cross-replica context: each shard where it lives."""
    if num_unique is not None:
      ids, grads = ids[:num_unique], grads[:num_unique]
    shards = dict(self._params.local_shards())
    if len(shards) != self.layout.num_shards:
      raise RuntimeError(
        f"table {self.name!r} is row-sharded over replicas on several "
        "workers: apply its gradients inside strategy.run (a replica step), "
        "where each worker updates its own rows."
      )
    order = sorted(shards)
    slot_shards = {
      slot: [dict(v.local_shards())[i] for i in order]
      for slot, v in self._slots.items()
    }
    row_layout.apply(
      self.optimizer,
      self.layout,
      [shards[i] for i in order],
      slot_shards,
      ids,
      grads,
      rounding=self._update_rounding(),
    )


@functools.cache
def _warn_dynamic_all_to_all(table_name: str) -> None:
  log.warning(
    "table %r: this step's number of ids is not known when the step is "
    "traced (a batch of unknown size, or a sparse/ragged feature without "
    "a static width), so it exchanges by all-gather instead of all-to-all: "
    "same numbers, more bytes. Batch with drop_remainder=True, and give "
    "sparse/ragged features the backend's bag_widths option (then "
    "preprocess() in the input pipeline).",
    table_name,
  )


@functools.cache
def _warn_whole_table_init(table_name: str, initializer: Any) -> None:
  log.warning(
    "table %r: its initializer %r has no row-keyed form "
    "(backends.storage.row_init), so the whole table is drawn once on this "
    "host "
    "and each shard keeps its rows. Use a Keras/TF RandomUniform, "
    "RandomNormal, TruncatedNormal, VarianceScaling or constant "
    "initializer to initialize shard by shard.",
    table_name,
    type(initializer).__name__,
  )


@functools.cache
def _warn_full_read(table_name: str) -> None:
  log.warning(
    "table %r: a lookup outside the replica step of a row-sharded table "
    "whose shards live on several workers reads the whole table. Look up "
    "inside strategy.run.",
    table_name,
  )
