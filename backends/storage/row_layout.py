"""How a table's rows are split into shards, and the host-side routing.

A row-sharded table keeps its rows in `num_shards` variables. A layout says
which shard owns a row id and where the row sits in it:

* `ContiguousRows` — shard `i` holds the row range `[offsets[i],
  offsets[i+1])`: TF's `ShardedVariable` over parameter servers ("div"
  partitioning), and the replicas' shards of `contiguous` placement.
* `StridedRows` — shard `r` of `R` holds rows `r, r + R, r + 2R, ...`
  (`id mod R`): frequent ids, which vocabularies built by frequency number
  first, spread evenly over the shards.

`gather` and `apply` route unique ids to the shards that own them where
the shards are reachable from this host (parameter servers, or the local
replicas of a strategy in cross-replica context); the replicas' exchange in
a step is `backends.storage.row_sharded`'s.

Example:
  >>> layout = StridedRows(vocabulary_size=10, num_shards=4)
  >>> layout.shard_rows      # 3 rows each: ids 8, 9 sit in shards 0, 1
  3
"""

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from backends import optimizers, placement
from backends.storage import narrow


class RowLayout(abc.ABC):
  """Which shard owns each row of a `[vocabulary_size, D]` table.

  Attributes:
    vocabulary_size: the table's rows.
    num_shards: how many shards hold them.
  """

  name: str = ""

  def __init__(self, vocabulary_size: int, num_shards: int):
    if num_shards < 1:
      raise ValueError(f"num_shards={num_shards}; need >= 1.")
    self.vocabulary_size = int(vocabulary_size)
    self.num_shards = int(num_shards)

  @abc.abstractmethod
  def owner(self, ids: tf.Tensor) -> tf.Tensor:
    """int32: the shard owning each id (ids in `[0, vocabulary_size)`)."""

  @abc.abstractmethod
  def local(self, ids: tf.Tensor) -> tf.Tensor:
    """int64: each id's row inside its owner's shard."""

  @abc.abstractmethod
  def rows_of(self, shard: int) -> int:
    """The number of rows shard `shard` holds (real rows, no padding)."""

  @abc.abstractmethod
  def rows_in(self, shard: int) -> range:
    """The table rows shard `shard` holds, in the order it stores them."""

  @abc.abstractmethod
  def global_ids(self, shard: Any, local: tf.Tensor) -> tf.Tensor:
    """int64: the table rows of rows `local` of shard `shard` (an int or
    an int tensor, e.g. a replica id): `local`'s inverse."""

  def __repr__(self) -> str:
    return (
      f"{type(self).__name__}(vocabulary_size={self.vocabulary_size}, "
      f"num_shards={self.num_shards})"
    )


class ContiguousRows(RowLayout):
  """Shard `i` holds rows `[offsets[i], offsets[i + 1])`.

  Args:
    offsets: `[0, n0, n0 + n1, ..., vocabulary_size]`.
  """

  name = "contiguous"

  def __init__(self, offsets: Sequence[int], size: int | None = None):
    super().__init__(offsets[-1], len(offsets) - 1)
    self.offsets = [int(o) for o in offsets]
    self._size = size  # every range this long (the last ones shorter)

  @classmethod
  def even(cls, vocabulary_size: int, num_shards: int) -> "ContiguousRows":
    """Equal ranges of `ceil(V / num_shards)` rows; the last ones shorter
    (`backends.placement.contiguous_offsets`)."""
    return cls(
      placement.contiguous_offsets(vocabulary_size, num_shards),
      -(-vocabulary_size // num_shards),
    )

  def owner(self, ids: tf.Tensor) -> tf.Tensor:
    ids = tf.cast(ids, tf.int64)
    if self.num_shards == 1:
      return tf.zeros_like(ids, tf.int32)
    if self._size is not None:
      return tf.cast(tf.math.floordiv(ids, self._size), tf.int32)
    bounds = tf.constant(self.offsets[1:-1], tf.int64)
    return tf.cast(tf.searchsorted(bounds, ids, side="right"), tf.int32)

  def local(self, ids: tf.Tensor) -> tf.Tensor:
    ids = tf.cast(ids, tf.int64)
    if self.num_shards == 1:
      return ids
    if self._size is not None:
      return tf.math.floormod(ids, self._size)
    first = tf.constant(self.offsets[:-1], tf.int64)
    return ids - tf.gather(first, self.owner(ids))

  def rows_of(self, shard: int) -> int:
    return self.offsets[shard + 1] - self.offsets[shard]

  def rows_in(self, shard: int) -> range:
    return range(self.offsets[shard], self.offsets[shard + 1])

  def global_ids(self, shard: Any, local: tf.Tensor) -> tf.Tensor:
    first = tf.gather(tf.constant(self.offsets[:-1], tf.int64), shard)
    return first + tf.cast(local, tf.int64)


class StridedRows(RowLayout):
  """Shard `r` holds rows `r, r + R, r + 2R, ...` (`id mod R`)."""

  name = "strided"

  @property
  def shard_rows(self) -> int:
    """Rows of the largest shard: `ceil(V / R)`."""
    return -(-self.vocabulary_size // self.num_shards)

  def owner(self, ids: tf.Tensor) -> tf.Tensor:
    return tf.cast(
      tf.math.floormod(tf.cast(ids, tf.int64), self.num_shards), tf.int32
    )

  def local(self, ids: tf.Tensor) -> tf.Tensor:
    return tf.math.floordiv(tf.cast(ids, tf.int64), self.num_shards)

  def rows_of(self, shard: int) -> int:
    return len(self.rows_in(shard))

  def rows_in(self, shard: int) -> range:
    return range(shard, self.vocabulary_size, self.num_shards)

  def global_ids(self, shard: Any, local: tf.Tensor) -> tf.Tensor:
    shard = tf.cast(shard, tf.int64)
    return tf.cast(local, tf.int64) * self.num_shards + shard


def make(name: str, vocabulary_size: int, num_shards: int) -> RowLayout:
  """The layout `name` ("strided" or "contiguous") of equal-sized shards."""
  if name == StridedRows.name:
    return StridedRows(vocabulary_size, num_shards)
  if name == ContiguousRows.name:
    return ContiguousRows.even(vocabulary_size, num_shards)
  raise ValueError(
    f"unknown row layout {name!r}; use 'strided' (row id mod the number of "
    "replicas) or 'contiguous' (equal row ranges)."
  )


# -- the full table and its shards -------------------------------------------


def to_full(layout: RowLayout, stacked: tf.Tensor) -> tf.Tensor:
  """The `[V, D]` table from its shards stacked as `[R, S, D]` (no padding)."""
  num, size = layout.num_shards, stacked.shape[1]
  dim = stacked.shape[2]
  if isinstance(layout, StridedRows):
    rows = tf.reshape(tf.transpose(stacked, [1, 0, 2]), [num * size, dim])
  else:
    rows = tf.reshape(stacked, [num * size, dim])
  return rows[: layout.vocabulary_size]


def to_shards(layout: RowLayout, full: tf.Tensor, size: int) -> tf.Tensor:
  """`[R, S, D]` equal-sized shards of a full `[V, D]` table (padding 0)."""
  num = layout.num_shards
  full = tf.convert_to_tensor(full)
  pad = num * size - layout.vocabulary_size
  rows = tf.pad(full, [[0, pad], [0, 0]])
  if isinstance(layout, StridedRows):
    return tf.transpose(tf.reshape(rows, [size, num, -1]), [1, 0, 2])
  return tf.reshape(rows, [num, size, -1])


# -- routing on the host ---------------------------------------------------


def _route(layout: RowLayout, ids: tf.Tensor):
  """Splits unique ids by owner: (local ids per shard, positions per shard)."""
  if layout.num_shards == 1:
    return [tf.cast(ids, tf.int64)], None
  owner = layout.owner(ids)
  positions = tf.dynamic_partition(
    tf.range(tf.size(ids)), owner, layout.num_shards
  )
  local = tf.dynamic_partition(layout.local(ids), owner, layout.num_shards)
  return local, positions


def write_rows(
  layout: RowLayout,
  shards: Sequence[tuple[int, Any]],
  rows: tf.Tensor,
  values: tf.Tensor,
) -> list[Any]:
  """Writes `values` `[k, D]` into table rows `rows` (int64 `[k]`): each of
  `shards` (`(shard index, variable)`, those this process holds) the rows
  it owns, on its device. The writes (e.g. a reused row's starting values).
  """
  owners = layout.owner(rows)
  local = layout.local(rows)
  writes = []
  for index, shard in shards:
    mine = tf.equal(owners, index)
    with tf.device(shard.device):
      writes.append(
        shard.scatter_update(
          tf.IndexedSlices(
            tf.boolean_mask(values, mine), tf.boolean_mask(local, mine)
          )
        )
      )
  return writes


def gather(
  layout: RowLayout, shards: Sequence[Any], ids: tf.Tensor
) -> tf.Tensor:
  """Rows `ids` of a table held in `shards`, each gathered where it lives
  (a narrow table's upcast to float32, `backends.storage.narrow`)."""
  local_ids, positions = _route(layout, ids)
  parts = []
  for shard, local in zip(shards, local_ids):
    with tf.device(shard.device):
      rows = tf.raw_ops.ResourceGather(
        resource=shard.handle, indices=local, dtype=shard.dtype
      )
      parts.append(tf.cast(rows, narrow.math_dtype(shard.dtype)))
  if positions is None:
    return parts[0]
  return tf.dynamic_stitch(positions, parts)


def apply(
  optimizer: Any,
  layout: RowLayout,
  shards: Sequence[Any],
  slot_shards: Mapping[str, Sequence[Any]],
  ids: tf.Tensor,
  grads: tf.Tensor,
  rounding: Callable[[int], Any] | None = None,
) -> None:
  """`apply_sparse_update` on each shard with its own rows, where it lives.

  Args:
    optimizer: the table's embedding optimizer.
    layout: how the rows are split.
    shards: the table's shard variables; `slot_shards` each slot's, alike.
    ids: unique row ids `[U]`; `grads` their summed gradients `[U, D]`.
    rounding: shard index -> that shard's stochastic rounding (a narrow
      table's); None: float32 shards.
  """
  local_ids, positions = _route(layout, ids)
  for i, (shard, local) in enumerate(zip(shards, local_ids)):
    shard_grads = grads if positions is None else tf.gather(grads, positions[i])
    with tf.device(shard.device):
      optimizers.apply_sparse_update(
        optimizer,
        shard,
        {k: v[i] for k, v in slot_shards.items()},
        local,
        shard_grads,
        rounding=rounding(i) if rounding is not None else None,
      )
