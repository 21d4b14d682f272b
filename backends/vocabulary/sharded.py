"""A dynamic table's index in shards (`ShardedIndex`): the id space split
by a hash of the id, each shard a `VocabularyIndex` of its own over a
contiguous range of the table's rows.

Why shards: one index over every row is one object, held whole by one
process; the shard is the unit that can live apart (on another parameter
server, another worker process) and move on a restore, as TorchRec's
managed-collision buckets do. What a shard decides depends only on its
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

A process may hold only some shards (`held`: worker processes of a
MultiWorkerMirroredStrategy, `backends.vocabulary.stage`): ids of the
others read `NOT_HELD`, for the caller to fill in from their holders.

Checkpoints: each piece of state (keys, counts, the sketch, the counters,
...) is one tensor `[N, 1]` for all shards, shard `s`'s part a range of its
rows (`ShardedState`): TF's save writes it whole when every shard is here;
`backends.storage.row_sharded_checkpoint` writes each process's shards as
slices of it, so a restore into any number of processes reads the shards
each holds. A shard's id table is not saved: a restore rebuilds it from
the shard's ids and occupied rows.

Example:
  >>> index = ShardedIndex("users", 1000, DynamicVocabulary(shards=4))
  >>> index.update(tf.constant([7, 2**40]), step=0).rows   # one row each
"""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from backends import _tf_internal
from backends.errors import BackendError
from backends.vocabulary import index as index_lib
from backends.vocabulary.policy import SKETCH_ROWS, DynamicVocabulary, Eviction

#: The row of an id whose shard another process holds.
NOT_HELD = -2

#: A shard's state (`VocabularyIndex`'s variables), by kind: one entry a
#: row, the sketch's cells, one scalar.
_ROW_STATE = ("keys", "occupied", "counts", "last_seen")
_SCALARS = ("rows_in_use", "admissions", "evictions", "refused", "default_hits")


class ShardedIndexError(BackendError, RuntimeError):
  """A sharded index asked for what only all its shards can give here."""


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
    held: the shards this process holds (default: all).
    name: the module's name (default: "vocabulary_index_<table>").
  """

  def __init__(
    self,
    table: str,
    vocabulary_size: int,
    policy: DynamicVocabulary,
    fused_ops: Any = None,
    devices: Sequence[str | None] | None = None,
    held: Sequence[int] | None = None,
    name: str | None = None,
  ) -> None:
    policy.check(table, vocabulary_size)
    super().__init__(name=name or index_lib.module_name(table))
    self.table_name = table
    self.vocabulary_size = int(vocabulary_size)
    self.policy = policy
    self.capacity = policy.id_rows(self.vocabulary_size)
    count = policy.shards
    self.bounds = tuple(policy.shard_bounds(self.vocabulary_size))
    self.held = tuple(range(count) if held is None else sorted(set(held)))
    devices = list(devices or [None])
    shard_policy = policy.shard_policy()
    shards = {}
    for s in self.held:
      with tf.device(devices[s % len(devices)]):
        shards[s] = index_lib.VocabularyIndex(
          f"{table} (shard {s})",
          self.bounds[s + 1] - self.bounds[s],
          shard_policy,
          name=f"{self.name}_shard_{s}",
          fused_ops=fused_ops,
        )
    # Not checkpoint children: their state is saved as `ShardedState`s.
    self._shards = _tf_internal.NoDependency(shards)
    #: Set by a caller whose shards are apart: sums a dict of int64
    #: counters over the processes (every process calls `counters` then).
    self.counter_sum: Callable[[dict], dict] | None = None
    self._restored: set[tuple[str, int]] = set()
    states = _tf_internal.AutoTrackable()
    self._states = _tf_internal.NoDependency({})
    for state, (dtype, spans) in _layout(policy, self.bounds).items():
      held_vars = {s: getattr(v, state) for s, v in shards.items()}
      self._states[state] = ShardedState(
        f"{self.name}/{state}", dtype, spans, held_vars, self._was_restored
      )
      _tf_internal.track_child(states, self._states[state], state)
    _tf_internal.track_child(self, states, "shards")

  @property
  def shards(self) -> list[index_lib.VocabularyIndex]:
    """The held shards' indices, in shard order."""
    return [self._shards[s] for s in self.held]

  @property
  def apart(self) -> bool:
    """Whether other processes hold some of the shards."""
    return len(self.held) < self.policy.shards

  # The state of the held shards' rows, read-only: their arrays joined (in
  # shard order; every shard's when all are here, the table's rows).
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
    """Whether the held shards update with the fused op."""
    return all(s.fused for s in self.shards)

  def index_bytes(self) -> int:
    """Bytes of state the held shards hold (`DynamicVocabulary.shard_bytes`)."""
    each = self.policy.shard_bytes(self.vocabulary_size)
    return sum(each[s] for s in self.held)

  def state_shapes(self) -> dict[str, tuple[int, ...]]:
    """Name -> shape of its state in a checkpoint (under the index)."""
    return {
      f"shards/{name}": tuple(state.shape.as_list())
      for name, state in self._states.items()
    }

  def counters(self) -> dict[str, tf.Tensor]:
    """`VocabularyIndex.counters`, summed over the shards (over every
    process's with `counter_sum`)."""
    each = [shard.counters() for shard in self.shards]
    zero = tf.constant(0, tf.int64)
    names = ("rows_in_use", "capacity", *_SCALARS[1:])
    local = {n: tf.add_n([c[n] for c in each]) if each else zero for n in names}
    return self.counter_sum(local) if self.counter_sum else local

  def mapping(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(keys, rows) of every id with a row in the held shards, by row."""
    keys, rows = [tf.zeros([0], tf.int64)], [tf.zeros([0], tf.int64)]
    for s, shard in zip(self.held, self.shards):
      k, r = shard.mapping()
      keys.append(k)
      rows.append(r + self.bounds[s])
    return tf.concat(keys, 0), tf.concat(rows, 0)

  @tf.autograph.experimental.do_not_convert
  def lookup(self, ids: Any) -> tf.Tensor:
    """int64 [n]: the row of each id (flattened), -1 or `NOT_HELD`;
    changes nothing."""
    keys = index_lib.keys_of(self.table_name, ids)
    rows, _ = self._by_shard(
      keys, lambda shard, part: (shard.lookup(part), None)
    )
    return rows

  @tf.autograph.experimental.do_not_convert
  def update(self, ids: Any, step: Any) -> index_lib.IndexUpdate:
    """Each held shard's update on its ids (the module docstring); ids of
    the other shards read `NOT_HELD`."""
    keys = index_lib.keys_of(self.table_name, ids)
    step = index_lib.step_of(self.table_name, step)

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
    every held shard; the keys' table rows in input order (`NOT_HELD` for
    the other shards'), and the reset rows."""
    count = self.policy.shards
    shard = index_lib.shard_of(keys, self.policy.seed, count)
    parts = tf.dynamic_partition(keys, shard, count)
    where = tf.dynamic_partition(tf.range(tf.size(keys)), shard, count)
    rows, resets = [], [tf.zeros([0], tf.int64)]
    for s, part in enumerate(parts):
      if s not in self._shards:
        rows.append(tf.fill(tf.shape(part), tf.constant(NOT_HELD, tf.int64)))
        continue
      got, reset = fn(self._shards[s], part)
      begin = self.bounds[s]
      rows.append(tf.where(got >= 0, got + begin, got))
      if reset is not None:
        resets.append(reset + begin)
    joined = tf.reshape(tf.dynamic_stitch(where, rows), tf.shape(keys))
    return joined, tf.concat(resets, 0)

  def _was_restored(self, state: str, shard: int) -> None:
    """A restore wrote `state` of `shard`: once its ids and occupied rows
    are both in, its id table is rebuilt from them."""
    self._restored.add((state, shard))
    if {("keys", shard), ("occupied", shard)} <= self._restored:
      self._restored -= {("keys", shard), ("occupied", shard)}
      _rebuild_id_table(self._shards[shard])


def _rebuild_id_table(shard: index_lib.VocabularyIndex) -> None:
  """Makes a shard's id table hold exactly its occupied rows' ids."""
  old_keys, old_rows = shard.table.export()
  shard.table.remove(tf.boolean_mask(old_keys, old_rows >= 0))
  rows = tf.reshape(tf.where(shard.occupied), [-1])
  shard.table.insert(tf.gather(shard.keys, rows), rows)


def _layout(
  policy: DynamicVocabulary, bounds: Sequence[int]
) -> dict[str, tuple[tf.DType, list[tuple[int, int]]]]:
  """State name -> (dtype, each shard's (first row, rows) in its `[N, 1]`
  checkpoint tensor)."""
  count = policy.shards
  rows = [(bounds[s], bounds[s + 1] - bounds[s]) for s in range(count)]
  shard = policy.shard_policy()
  cells = [SKETCH_ROWS * shard.sketch_columns(n) for _, n in rows]
  starts = [sum(cells[:s]) for s in range(count)]
  out: dict[str, tuple[tf.DType, list[tuple[int, int]]]] = {}
  for name in _ROW_STATE:
    out[name] = (tf.bool if name == "occupied" else tf.int64, rows)
  out["sketch_cells"] = (tf.int64, list(zip(starts, cells)))
  scalars = [(s, 1) for s in range(count)]
  for name in _SCALARS:
    out[name] = (tf.int64, scalars)
  if policy.eviction is Eviction.AGE:
    out["free_rows"] = (tf.int64, rows)
    out["free_head"] = (tf.int64, scalars)
  return out


class ShardedState(_tf_internal.Trackable):
  """One piece of a sharded index's state for all its shards: a checkpoint
  tensor `[N, 1]`, shard `s`'s variable (its value flattened) at rows
  `[first_s, first_s + rows_s)`.

  Saved by slices as a row-sharded table is (`saves_slices`, the chunk
  methods of `backends.storage.row_sharded_checkpoint`), or whole by TF's
  own save when every shard is here.
  """

  def __init__(
    self,
    name: str,
    dtype: tf.DType,
    spans: list[tuple[int, int]],
    held: dict[int, tf.Variable],
    restored: Callable[[str, int], None],
  ):
    self.name = name
    self.dtype = dtype
    self._spans = spans
    self._held = held
    self._restored = restored
    self._state = name.rsplit("/", 1)[-1]
    self.shape = tf.TensorShape([sum(n for _, n in spans), 1])

  def saves_slices(self) -> bool:
    return True

  def local_chunks(self) -> list[tuple[str, int, int, tf.Variable, int]]:
    """Each held shard's part: `(slice spec, first row, rows, variable, 0)`."""
    from backends.storage import row_sharded  # noqa: PLC0415 - no cycle

    total = int(self.shape[0])
    return [
      (row_sharded.slice_spec(total, 1, first, rows), first, rows, var, 0)
      for s, var in sorted(self._held.items())
      for first, rows in [self._spans[s]]
    ]

  saved_chunks = local_chunks  # each process saves the shards it holds

  def read_chunk(self, variable: tf.Variable, local: int, count: int):
    del local, count  # a chunk is a whole shard's variable
    with tf.device(variable.device):
      return tf.reshape(variable.read_value(), [-1, 1])

  def assign_rows(self, begin: int, rows: Any) -> None:
    """Rows `[begin, begin + len(rows))` into the held shards they cover
    (each shard's whole part)."""
    rows = tf.convert_to_tensor(rows, self.dtype)
    end = begin + int(rows.shape[0])
    for s, variable in sorted(self._held.items()):
      first, count = self._spans[s]
      if first < begin or first + count > end:
        continue
      part = rows[first - begin : first - begin + count]
      with tf.device(variable.device):
        variable.assign(tf.reshape(part, variable.shape))
      self._restored(self._state, s)

  def _serialize_to_tensors(self) -> dict[str, Any]:
    from backends.storage import row_sharded  # noqa: PLC0415 - no cycle

    key = _tf_internal.VARIABLE_VALUE_KEY
    save, restore = row_sharded.rows_left_outside()
    if restore:
      return {}  # read shard by shard
    if save:  # the key recorded; the shards written apart
      device = next(iter(self._held.values())).device if self._held else ""
      return {
        key: _tf_internal.SaveSpec(
          lambda: None, "", "", dtype=self.dtype, device=device or "/cpu:0"
        )
      }
    if len(self._held) < len(self._spans):
      raise ShardedIndexError(
        f"{self.name}: this process holds shards {sorted(self._held)} of "
        f"{len(self._spans)}; the others are other processes'. Save it with "
        "the project's checkpoints (backends.storage.row_sharded_checkpoint."
        "save, as the Trainer does), which write each process's shards."
      )
    with tf.device("/cpu:0"):
      return {
        key: tf.concat([self.read_chunk(v, 0, 0) for v in self._ordered()], 0)
      }

  def _ordered(self) -> list[tf.Variable]:
    return [self._held[s] for s in range(len(self._spans))]

  def _restore_from_tensors(self, restored_tensors: dict[str, Any]):
    self.assign_rows(0, restored_tensors[_tf_internal.VARIABLE_VALUE_KEY])


__all__ = ["NOT_HELD", "ShardedIndex", "ShardedIndexError", "ShardedState"]
