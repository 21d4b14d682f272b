"""How a row-sharded table's replicas exchange ids, rows and gradients.

Each replica of a step holds `U` unique ids of a table (a static bound: its
features' id slots) whose rows live on their owners' shards. Two
exchanges, both with shapes fixed before the step (as collectives in a
compiled program or a loop need), chosen per table by the planner:

* `AllGather`: every replica's ids go to every replica (`[R * U]`); each
  owner reads the rows it owns and an all-reduce sums them; the gradients
  are all-gathered. Never overflows; a replica's traffic and work grow
  with the replica count `R`.
* `AllToAll`: each id goes only to the replica that owns it and each row
  (and row gradient) only back to the replica that asked, in buckets of a
  fixed per-owner capacity `K` (`owner_capacity`: the even share `U / R`
  plus a margin). A replica's traffic is about `R * K ~ U` ids and rows
  whatever `R`. Ids spread unevenly over the owners can overflow a bucket:
  every replica learns it in the same step (each bucket carries its
  sender's largest bucket) and the step fails with an error naming the
  table and the capacity to raise; a compiled step, which cannot raise,
  counts it and the host raises after the step (`Overflow`).

Either way each owner then sums its rows' gradients over every replica and
applies the optimizer to its own rows (`owner_updates`).

Example:
  >>> exchange = AllToAll(layout, capacity=owner_capacity(512, 4))
  >>> rows, record = exchange.lookup(ctx, shard, ids, valid, 512, "C10")
"""

import abc
from typing import Any

import tensorflow as tf

from backends import _tf_internal, optimizers, placement, static_bags
from backends import input_checks as checks_lib
from backends.errors import BackendError
from backends.storage import narrow, row_layout

#: Exchanges a row-sharded table can use (`backends.placement` plans them).
ALL_GATHER, ALL_TO_ALL = placement.ALL_GATHER, placement.ALL_TO_ALL
EXCHANGES = placement.EXCHANGES
CAPACITY_SIGMAS = placement.CAPACITY_SIGMAS
owner_capacity = placement.owner_capacity


class ExchangeOverflowError(BackendError, ValueError):
  """More ids of one step went to one owner than its exchange capacity."""


class Exchange(abc.ABC):
  """A row-sharded table's exchange in one replica step.

  Args:
    layout: which shard owns each row.
  """

  name = ""

  def __init__(self, layout: row_layout.RowLayout):
    self.layout = layout

  @abc.abstractmethod
  def lookup(
    self,
    ctx: Any,
    shard: tf.Variable,
    ids: tf.Tensor,
    valid: tf.Tensor,
    capacity: int | tf.Tensor,
    table: str,
  ) -> tuple[tf.Tensor, Any]:
    """`(rows [len(ids), D], record)` of this replica's unique `ids`."""

  @abc.abstractmethod
  def route_ids(
    self,
    ctx: Any,
    ids: tf.Tensor,
    valid: tf.Tensor,
    capacity: int | tf.Tensor,
    table: str,
  ) -> Any:
    """The record of this replica's unique `ids` sent to their owners (the
    lookup's first half): what `gradients` then routes rows back by."""

  @abc.abstractmethod
  def gradients(
    self, ctx: Any, record: Any, row_grads: tf.Tensor
  ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`(local ids, owned, grads)` of the rows this owner must update.

    Every replica's gradients of this owner's rows, one slot each: `local`
    int64 rows of the shard, `owned` whether the slot holds one.
    """


def _pad_to(values: tf.Tensor, size: int | tf.Tensor, fill) -> tf.Tensor:
  """`values` padded along axis 0 to `size` rows with `fill`."""
  pad = size - tf.shape(values)[0]
  paddings = [[0, pad]] + [[0, 0]] * (values.shape.rank - 1)
  out = tf.pad(values, paddings, constant_values=fill)
  if isinstance(size, int):
    out = tf.ensure_shape(out, [size] + values.shape.as_list()[1:])
  return out


def _read(shard: tf.Variable, local: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Rows `local` of `shard` (zeros where not `mask`), in float32 (a narrow
  shard's upcast: the exchange and the model see float32 rows)."""
  rows = tf.raw_ops.ResourceGather(
    resource=shard.handle, indices=local, dtype=shard.dtype
  )
  rows = tf.cast(rows, narrow.math_dtype(shard.dtype))
  return rows * tf.cast(mask, rows.dtype)[..., tf.newaxis]


class AllGather(Exchange):
  """Every replica's ids to every replica; rows summed by an all-reduce."""

  name = ALL_GATHER

  def route_ids(self, ctx, ids, valid, capacity, table):
    del table
    if not isinstance(capacity, int):
      # Known when the step runs: every replica sends the largest.
      capacity = tf.reduce_max(
        ctx.all_gather(tf.reshape(tf.cast(capacity, tf.int32), [1]), axis=0)
      )
    sent = _pad_to(tf.where(valid, tf.cast(ids, tf.int64), -1), capacity, -1)
    all_ids = ctx.all_gather(sent, axis=0)  # [R * U]
    known = tf.maximum(all_ids, 0)
    me = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    owned = tf.logical_and(all_ids >= 0, self.layout.owner(known) == me)
    local = tf.where(owned, self.layout.local(known), 0)
    return owned, local, capacity

  def lookup(self, ctx, shard, ids, valid, capacity, table):
    num, dim = self.layout.num_shards, int(shard.shape[1])
    owned, local, capacity = record = self.route_ids(
      ctx, ids, valid, capacity, table
    )
    summed = ctx.all_reduce(
      tf.distribute.ReduceOp.SUM, _read(shard, local, owned)
    )
    me = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    mine = tf.gather(tf.reshape(summed, [num, capacity, dim]), me)
    return mine[: tf.shape(ids)[0]], record

  def gradients(self, ctx, record, row_grads):
    owned, local, capacity = record
    return local, owned, ctx.all_gather(_pad_to(row_grads, capacity, 0.0), 0)


class AllToAll(Exchange):
  """Each id to its owner only, each row back to its asker only.

  Args:
    layout: which shard owns each row.
    capacity: ids one replica may send one owner per step (`K`).
    fused_ops: the fused CPU kernels, whose `recsys_buckets` fills the send
      buffer in one pass outside XLA (the same slots); None: TF ops.
  """

  name = ALL_TO_ALL

  def __init__(
    self,
    layout: row_layout.RowLayout,
    capacity: int,
    fused_ops: Any = None,
  ):
    super().__init__(layout)
    self.capacity = int(capacity)
    self._fused_ops = fused_ops

  def route_ids(self, ctx, ids, valid, capacity, table):
    if not isinstance(capacity, int):
      raise TypeError(
        f"table {table!r}: the all-to-all exchange needs a static number of "
        "ids per step (bag widths)."
      )
    num, k = self.layout.num_shards, self.capacity
    # Only the buffers sent need a fixed size: the ids are bucketed as
    # they are (fewer than `capacity` in a step of the dynamic engine).
    known = tf.where(valid, tf.cast(ids, tf.int64), 0)
    owner, local = self.layout.owner(known), self.layout.local(known)
    # Bucket j: the local rows asked of owner j, filled from its start, then
    # how many it holds and this replica's largest bucket, so every replica
    # learns of any overflow.
    if self._fused_ops is not None and not _tf_internal.in_xla_context():
      slot, send, counts = self._fused_ops.recsys_buckets(
        owner=owner, local=local, valid=valid, num_shards=num, capacity=k
      )
    else:
      slot, counts = _buckets(owner, valid, num, k)
      send = tf.scatter_nd(slot[:, tf.newaxis], local, [num * k + 1])[: num * k]
    largest = tf.fill([num], tf.reduce_max(counts))
    header = tf.stack([tf.minimum(counts, k), largest], 1)
    received = _tf_internal.all_to_all(
      ctx, tf.concat([tf.reshape(send, [num, k]), tf.cast(header, tf.int64)], 1)
    )
    return _AllToAllRecord(
      slot,
      received[:, :k],  # [R, K] rows of this shard each replica asked
      received[:, k],  # how many of them each replica filled
      tf.reduce_max(received[:, k + 1]),
    )

  def lookup(self, ctx, shard, ids, valid, capacity, table):
    num, k = self.layout.num_shards, self.capacity
    record = self.route_ids(ctx, ids, valid, capacity, table)
    # Unfilled slots (0) serve row 0: their asker reads no slot it did
    # not fill.
    served = tf.raw_ops.ResourceGather(
      resource=shard.handle, indices=record.asked, dtype=shard.dtype
    )
    served = tf.cast(served, narrow.math_dtype(shard.dtype))  # [R, K, D]
    back = tf.reshape(_tf_internal.all_to_all(ctx, served), [num * k, -1])
    # An id past its bucket (an overflow, which fails the step) reads 0.
    sent = record.slot < num * k
    rows = tf.gather(back, tf.where(sent, record.slot, 0))
    return tf.where(sent[:, tf.newaxis], rows, tf.zeros_like(rows)), record

  def gradients(self, ctx, record, row_grads):
    num, k = self.layout.num_shards, self.capacity
    dim = int(row_grads.shape[1])
    send = tf.scatter_nd(
      record.slot[:, tf.newaxis], row_grads, [num * k + 1, dim]
    )[: num * k]
    received = _tf_internal.all_to_all(ctx, tf.reshape(send, [num, k, dim]))
    owned = tf.range(k, dtype=tf.int64) < record.filled[:, tf.newaxis]
    return (
      tf.reshape(record.asked, [-1]),
      tf.reshape(owned, [-1]),
      tf.reshape(received, [-1, dim]),
    )

  def overflow(self, record: Any) -> tf.Tensor:
    """int64: how far the step's largest bucket went over the capacity."""
    return tf.maximum(record.needed - self.capacity, 0)

  def overflow_message(self, table: str) -> str:
    """The error for an overflow; one `{}`: the largest bucket."""
    return (
      f"table {table!r}: in one step a replica sent {{}} ids to one owner, "
      f"over the all-to-all exchange's capacity of {self.capacity} per "
      "owner (the ids are not spread evenly over the owners' rows, e.g. a "
      "vocabulary that numbers frequent ids first under the contiguous "
      "layout). Raise EmbeddingPlacement.exchange_sigmas, place the table "
      "with EmbeddingPlacement.row_layout = 'strided', or use "
      "EmbeddingPlacement.exchange = 'all_gather' (it never overflows). "
      "Nothing was saved after the step."
    )


class _AllToAllRecord:
  """What the lookup's all-to-all leaves for the update."""

  def __init__(
    self,
    slot: tf.Tensor,
    asked: tf.Tensor,
    filled: tf.Tensor,
    needed: tf.Tensor,
  ):
    self.slot = slot  # int32 [U]: each id's slot in the send buffer
    self.asked = asked  # int64 [R, K]: local rows asked by each replica
    self.filled = filled  # int64 [R]: the slots each replica filled
    self.needed = needed  # int64: the largest bucket of any replica


def _buckets(
  owner: tf.Tensor, valid: tf.Tensor, num: int, k: int
) -> tuple[tf.Tensor, tf.Tensor]:
  """Each id's slot in a `[num * k]` send buffer, and each owner's count of
  ids (`[num]`, over `k` when its bucket overflows).

  Ids go to their owner's bucket in order, filling it from its start; an
  invalid id, or one past its bucket's `k`, gets slot `num * k` (not sent).
  """
  size = owner.shape[0] if owner.shape[0] is not None else tf.size(owner)
  key = tf.where(valid, owner, num)  # invalid ids sort last
  order = tf.argsort(key, stable=True)
  ordered = tf.gather(key, order)
  counts = tf.math.unsorted_segment_sum(
    tf.ones_like(key), key, num + 1
  )  # [num + 1]
  starts = tf.cumsum(counts, exclusive=True)
  rank = tf.range(size) - tf.gather(starts, ordered)
  position = tf.scatter_nd(order[:, tf.newaxis], rank, [size])
  fits = tf.logical_and(valid, position < k)
  slot = tf.where(fits, owner * k + position, num * k)
  return slot, counts[:num]


def owner_updates(
  table: tf.Variable,
  slots: dict[str, tf.Variable],
  local: tf.Tensor,
  owned: tf.Tensor,
  grads: tf.Tensor,
  shard_rows: int,
  static: bool,
  rounding: narrow.Rounding | None = None,
) -> list[optimizers.SparseUpdate]:
  """The owner's update: its rows' gradients summed over every replica.

  Args:
    table, slots: this replica's shard variables.
    local, owned, grads: `Exchange.gradients`.
    shard_rows: rows per shard (the de-duplication's bound).
    static: a fixed-size, masked update (compiled steps) or only the rows.
    rounding: a narrow shard's stochastic rounding (of its local row ids).
  """
  if not static:
    # Only the slots that hold a row: work in proportion to them, not to
    # the exchange's capacity or the shard's rows.
    unique, index = tf.unique(tf.boolean_mask(local, owned), out_idx=tf.int32)
    summed = tf.math.unsorted_segment_sum(
      tf.boolean_mask(grads, owned), index, tf.size(unique)
    )
    return [
      optimizers.SparseUpdate(table, slots, unique, summed, rounding=rounding)
    ]
  dd = static_bags.dedup(local, owned, shard_rows)
  summed = tf.math.unsorted_segment_sum(
    grads * tf.cast(owned, grads.dtype)[:, tf.newaxis],
    dd.index,
    local.shape[0] if local.shape[0] is not None else tf.shape(local)[0],
  )
  summed = static_bags.pad_rows(summed, dd.num_unique)
  return [
    optimizers.SparseUpdate(
      table, slots, dd.ids, summed, keep=dd.num_unique > 0, rounding=rounding
    )
  ]


def check_overflow(exchange: Exchange, record: Any, table: str) -> list:
  """An assertion (uncompiled steps) that no bucket overflowed; or none."""
  if not isinstance(exchange, AllToAll) or _tf_internal.in_xla_context():
    return []
  return checks_lib.check(
    exchange.overflow(record) == 0,
    exchange.overflow_message(table),
    lambda: [record.needed],
  )
