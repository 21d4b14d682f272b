"""A dynamic table's index in shards (`ShardedIndex`): the id space split
by a hash of the id, each shard a `VocabularyIndex` of its own over a
contiguous range of the table's rows.

Why shards: one index over every row is one object, held whole by one
process; the shard is the unit that can live apart (on another parameter
server, another worker) and be moved on a restore, as TorchRec's
managed-collision buckets are. What a shard decides depends only on its
own ids in the step's order, so the same number of shards decides alike
whichever process holds which shard.

What `update(ids, step)` does, with S = `policy.shards` and the id rows
split by `policy.shard_bounds` (shard `s` owns rows `[b_s, b_{s+1})`):
  1. each id's shard: splitmix64(id ^ salt(seed, 3)) mod S (`index.shard_of`);
  2. shard by shard, the update of `backends/vocabulary/index.py` on the
     shard's ids in their order in the batch, over its `b_{s+1} - b_s` rows
     (its own sketch, admission, eviction and counters; its rows shifted
     by `b_s`);
  3. each input id's row (its shard's, or -1), and the rows to reset:
     shard 0's, then shard 1's, ...
So an id only takes a row of its shard: a full shard evicts (or refuses)
while another may have rows free, and no two ids ever share a row. The
counters are the shards' sums.

Example:
  >>> index = ShardedIndex("users", 1000, DynamicVocabulary(shards=4))
  >>> index.update(tf.constant([7, 2**40]), step=0).rows   # one row each
"""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from backends.vocabulary import index as index_lib
from backends.vocabulary.policy import DynamicVocabulary


class ShardedIndex(tf.Module):
  """The index of one dynamic table with `policy.shards` > 1 shards; the
  interface of `VocabularyIndex` (update, lookup, counters, mapping).

  Args:
    table: the table's name, for the errors.
    vocabulary_size: the table's rows (`TableConfig.vocabulary_size`).
    policy: the table's settings (`shards` > 1).
    fused_ops: as `VocabularyIndex`'s: each shard then updates with one
      fused op (outside XLA contexts).
    devices: shard `s` is made on `devices[s % len(devices)]` (parameter
      servers in turn); None: the current device.
    name: the module's name (default: "vocabulary_index_<table>").
  """

  def __init__(
    self,
    table: str,
    vocabulary_size: int,
    policy: DynamicVocabulary,
    fused_ops: Any = None,
    devices: Sequence[str | None] | None = None,
    name: str | None = None,
  ) -> None:
    policy.check(table, vocabulary_size)
    super().__init__(name=name or index_lib.module_name(table))
    self.table_name = table
    self.vocabulary_size = int(vocabulary_size)
    self.policy = policy
    self.capacity = policy.id_rows(self.vocabulary_size)
    self.bounds = tuple(policy.shard_bounds(self.vocabulary_size))
    devices = list(devices or [None])
    shard_policy = policy.shard_policy()
    shards = []
    for s in range(policy.shards):
      with tf.device(devices[s % len(devices)]):
        shards.append(
          index_lib.VocabularyIndex(
            f"{table} (shard {s})",
            self.bounds[s + 1] - self.bounds[s],
            shard_policy,
            name=f"{self.name}_shard_{s}",
            fused_ops=fused_ops,
          )
        )
    #: The shards' indices (checkpoint children "shards/<s>/...").
    self.shards = shards

  # The state of the whole table's rows, read-only: the shards' arrays
  # joined (shard ranges are consecutive), the sketches one after another.
  @property
  def keys(self) -> tf.Tensor:
    return self._joined("keys")

  @property
  def occupied(self) -> tf.Tensor:
    return self._joined("occupied")

  @property
  def counts(self) -> tf.Tensor:
    return self._joined("counts")

  @property
  def last_seen(self) -> tf.Tensor:
    return self._joined("last_seen")

  @property
  def sketch_cells(self) -> tf.Tensor:
    return self._joined("sketch_cells")

  def _joined(self, name: str) -> tf.Tensor:
    return tf.concat([getattr(s, name).read_value() for s in self.shards], 0)

  @property
  def default_row(self) -> int | None:
    """The row unknown ids read (`DynamicVocabulary.unknown_row`)."""
    return self.policy.unknown_row(self.vocabulary_size)

  @property
  def fused(self) -> bool:
    """Whether the shards update with the fused op."""
    return all(s.fused for s in self.shards)

  def index_bytes(self) -> int:
    """Bytes of state the shards hold (`DynamicVocabulary.index_bytes`)."""
    return self.policy.index_bytes(self.vocabulary_size)

  def state_names(self) -> set[str]:
    """The names its variables have in a checkpoint (under the index)."""
    return {
      f"shards/{s}/{name}"
      for s, shard in enumerate(self.shards)
      for name in shard.state_names()
    }

  def counters(self) -> dict[str, tf.Tensor]:
    """`VocabularyIndex.counters`, summed over the shards."""
    each = [shard.counters() for shard in self.shards]
    return {name: tf.add_n([c[name] for c in each]) for name in each[0]}

  def mapping(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(keys, rows) of every id with a row, by row (shard after shard)."""
    keys, rows = [], []
    for begin, shard in zip(self.bounds, self.shards):
      k, r = shard.mapping()
      keys.append(k)
      rows.append(r + begin)
    return tf.concat(keys, 0), tf.concat(rows, 0)

  @tf.autograph.experimental.do_not_convert
  def lookup(self, ids: Any) -> tf.Tensor:
    """int64 [n]: the row of each id (flattened), or -1; changes nothing."""
    keys = index_lib.keys_of(self.table_name, ids)
    rows, _ = self._by_shard(
      keys, lambda shard, part: (shard.lookup(part), None)
    )
    return rows

  @tf.autograph.experimental.do_not_convert
  def update(self, ids: Any, step: Any) -> index_lib.IndexUpdate:
    """Each shard's update on its ids (the module docstring)."""
    keys = index_lib.keys_of(self.table_name, ids)
    step = self.shards[0]._step_of(step)  # pylint: disable=protected-access

    def update(shard, part):
      (rows,), reset = shard.update_pieces([(part, None)], step)
      return rows, reset

    rows, reset_rows = self._by_shard(keys, update)
    return index_lib.IndexUpdate(rows=rows, reset_rows=reset_rows)

  @tf.autograph.experimental.do_not_convert
  def update_pieces(
    self, pieces: list[tuple[Any, tf.Tensor | None]], step: Any
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """`VocabularyIndex.update_pieces`: the pieces' ids in order, each
    piece's rows in its shape."""
    shaped = [
      (
        tf.reshape(index_lib.keys_of(self.table_name, ids), tf.shape(ids)),
        lengths,
      )
      for ids, lengths in pieces
    ]
    return index_lib.pieces_through(self.update, shaped, step)

  def _by_shard(self, keys: tf.Tensor, fn) -> tuple[tf.Tensor, tf.Tensor]:
    """`fn(shard, its keys) -> (rows in the shard, reset rows or None)` of
    every shard; the keys' table rows in input order, and the reset rows."""
    shard = index_lib.shard_of(keys, self.policy.seed, len(self.shards))
    parts = tf.dynamic_partition(keys, shard, len(self.shards))
    where = tf.dynamic_partition(
      tf.range(tf.size(keys)), shard, len(self.shards)
    )
    rows, resets = [], []
    for begin, index, part in zip(self.bounds, self.shards, parts):
      got, reset = fn(index, part)
      rows.append(tf.where(got >= 0, got + begin, got))
      if reset is not None:
        resets.append(reset + begin)
    joined = tf.reshape(tf.dynamic_stitch(where, rows), tf.shape(keys))
    return joined, tf.concat(resets, 0) if resets else None


__all__ = ["ShardedIndex"]
