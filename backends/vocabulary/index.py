"""The id -> row index of a dynamic-vocabulary table (`VocabularyIndex`):
its TensorFlow state, the update each training step makes, and the lookups.

A dynamic table keeps TF's `TableConfig`, whose `vocabulary_size` rows are
now a capacity; this index, in front of it, maps raw ids (any int64, or
strings) to rows. It runs in a `tf.function` in cross-replica context, once
per training step on the global batch's ids (not inside an XLA-compiled
step: a hash table and data-dependent shapes), and the caller resets the
rows it hands to new ids (`IndexUpdate.reset_rows`) before the lookup.

What `update(ids, step)` does, exactly (`tests/backends/vocabulary_reference.py`
is an independent twin of it, compared bit for bit):

  1. The call's distinct ids `u`, in order of first appearance, and their
     occurrences `occ`.
  2. Ids with a row: `counts[row] += occ`, `last_seen[row] = step`.
  3. Eviction "age", when `step % evict_every == 0` (floor modulo), before
     any admission: every occupied row with `last_seen != step` and
     `step - last_seen > max_age` is freed (its id leaves the hash table;
     counted in `evictions`).
  4. Ids without a row add `occ` to both rows of the count-min sketch; an
     id's estimate is the smaller of its two counters. It is a candidate
     when the estimate is >= `admit_after` and (`admit_probability == 1` or
     `lucky(id, step) < floor(admit_probability * 2**53)`); the others are
     refused (`refused += occ`) and read -1.
  5. Candidates, in first-appearance order, take the free rows in ascending
     order; when none is left (eviction other than "none"), the occupied
     rows with `last_seen != step`, ordered by (score, row) ascending, with
     score `last_seen` ("lru", "age") or `counts` ("lfu"). A candidate left
     without a row is refused. A row given to an id: `keys = id`,
     `occupied`, `counts = occ`, `last_seen = step`, the hash table updated
     (the victim's id removed), `admissions += 1` (and `evictions += 1` for
     a victim's row); the id's sketch counters are left as they are.
     `reset_rows` lists these rows in that order.
  6. `rows`: each input id's row after the update, or -1;
     `default_hits +=` the input ids (occurrences) reading -1.

The hashes are splitmix64 (Steele et al., 2014) in uint64 arithmetic:
  salt(p)       = splitmix64(seed ^ splitmix64(p))   p = 0, 1 (sketch rows),
                                                     2 (admission)
  bucket_r(id)  = splitmix64(id ^ salt(r)) mod sketch_width
  lucky(id, s)  = splitmix64(splitmix64(id ^ salt(2)) ^ s) >> 11
  shard(id)     = splitmix64(id ^ salt(3)) mod shards     (shards > 1:
                                                     `backends.vocabulary.sharded`)
with ids, the seed and the step taken as their 64 two's-complement bits.
String ids are first made 64-bit ids by `tf.fingerprint` (FarmHash64, its
8 bytes read little-endian as an int64): n distinct strings share an id
with probability about n**2 / 2**65 (1e-7 for 2**20 strings, 1e-3 for
2**30), and two strings that share one share its row.

Cost: a step without an eviction "age" sweep and with enough free rows is
O(n log n) in the batch's n ids (a unique, hash-table lookups, scatters of
n rows); finding victims (only when more candidates than free rows) and a
sweep read all R rows. Rows are handed out in ascending order: until the
table is full no two ids share a row.

Two implementations of `update`, one state: the TF ops below (the
reference, and what runs inside an XLA context), and, when the index is
given `fused_ops` (the tensorcore backend's loaded kernels,
`backends/tensorcore/kernels/vocabulary_ops.cc`), their op
`RecsysVocabularyUpdate`, which does the same steps in one CPU op on the
same hash table and variables, with identical results (rows, reset rows,
state, counters): a step may run either, and a checkpoint of one is the
other's. The caller injects the ops: this floor never imports a backend.

Example:
  >>> policy = DynamicVocabulary(admit_after=2)
  >>> index = VocabularyIndex("users", 1000, policy)
  >>> index.update(tf.constant([7, 7, 2**40]), step=1).rows   # [0, 0, -1]
  >>> index.lookup(tf.constant([2**40, 7]))                   # [-1, 0]
"""

import dataclasses
from typing import Any

import tensorflow as tf

from backends import _tf_internal
from backends.errors import BackendError
from backends.vocabulary.policy import (
  SKETCH_ROWS,
  DynamicVocabulary,
  Eviction,
  VocabularySettingError,
)

_MASK = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
#: The sketch's hash rows (salt purposes 0 and 1), then the admission
#: hash's purpose.
_SKETCH_ROWS = SKETCH_ROWS
_ADMIT = _SKETCH_ROWS
#: The hash that picks an id's shard (`shard_of`).
_SHARD = _ADMIT + 1
#: `lucky` is 53 bits: compared with `floor(admit_probability * 2**53)`.
_LUCKY_BITS = 53


class VocabularyIdsError(BackendError, TypeError):
  """Ids the index cannot take: not integers or strings."""


def splitmix64(x: int) -> int:
  """splitmix64's finalizer of `x`'s 64 bits, in Python ints."""
  z = (x + _GAMMA) & _MASK
  z = ((z ^ (z >> 30)) * _MUL1) & _MASK
  z = ((z ^ (z >> 27)) * _MUL2) & _MASK
  return z ^ (z >> 31)


def salt(seed: int, purpose: int) -> int:
  """The uint64 salt of one hash (`purpose`: a sketch row, or admission)."""
  return splitmix64((seed & _MASK) ^ splitmix64(purpose))


def _splitmix64(x: tf.Tensor) -> tf.Tensor:
  """`splitmix64` of a uint64 tensor, elementwise (wrapping arithmetic)."""

  def u64(c: int) -> tf.Tensor:
    return tf.constant(c, tf.uint64)

  def mix(z: tf.Tensor, shift: int) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, u64(shift)))

  z = x + u64(_GAMMA)
  z = mix(z, 30) * u64(_MUL1)
  z = mix(z, 27) * u64(_MUL2)
  return mix(z, 31)


def keys_of(table: str, ids: Any) -> tf.Tensor:
  """int64 [n]: `ids` flattened, as a dynamic (or hashed) table's 64-bit
  keys: integers as they are (uint64 bit for bit), strings fingerprinted.

  Raises:
    VocabularyIdsError: ragged or sparse ids, or ids neither integers nor
      strings, naming `table` and the dtype.
  """
  if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
    raise VocabularyIdsError(
      f"table {table!r}: the index takes a dense tensor of ids, "
      f"got a {type(ids).__name__}; pass its .flat_values (ragged) or "
      ".values (sparse)."
    )
  ids = tf.reshape(tf.convert_to_tensor(ids), [-1])
  if ids.dtype == tf.string:
    return tf.bitcast(tf.fingerprint(ids), tf.int64)
  if ids.dtype == tf.uint64:
    return tf.bitcast(ids, tf.int64)
  if ids.dtype.is_integer:
    return tf.cast(ids, tf.int64)
  raise VocabularyIdsError(
    f"table {table!r}: ids of dtype {ids.dtype.name}; a dynamic "
    "vocabulary takes integer ids (int64, int32, ...) or strings."
  )


def step_of(table: str, step: Any) -> tf.Tensor:
  """The training step as an int64 scalar.

  Raises:
    VocabularyIdsError: a step that is not an integer scalar, naming `table`.
  """
  step = tf.convert_to_tensor(step)
  if not step.dtype.is_integer or step.shape.rank not in (None, 0):
    raise VocabularyIdsError(
      f"table {table!r}: step {step!r}; give the training step "
      "as an integer scalar."
    )
  return tf.cast(step, tf.int64)


def shard_of(keys: tf.Tensor, seed: int, shards: int) -> tf.Tensor:
  """int32 [n]: the shard of each int64 key (`keys_of`) of an index split
  into `shards`: splitmix64(key ^ salt(seed, 3)) mod shards."""
  hashed = salted(keys, salt(seed, _SHARD))
  return tf.cast(
    tf.math.floormod(hashed, tf.constant(shards, tf.uint64)), tf.int32
  )


def salted(ids: tf.Tensor, salt_value: int) -> tf.Tensor:
  """splitmix64(id ^ salt) of int64 ids, as uint64."""
  bits = tf.bitcast(ids, tf.uint64)
  return _splitmix64(
    tf.bitwise.bitwise_xor(bits, tf.constant(salt_value, tf.uint64))
  )


@dataclasses.dataclass(frozen=True)
class IndexUpdate:
  """What one `VocabularyIndex.update` did.

  A `tf.function` may return it (it flattens to its two tensors).

  Attributes:
    rows: int64 [n]: the row of each input id (flattened, input order), or
      -1: the id has no row (it reads the default).
    reset_rows: int64 [k]: the rows given to new ids at this step, in
      assignment order; the caller resets their values and optimizer slots
      to the initializer before the lookup.
  """

  rows: tf.Tensor
  reset_rows: tf.Tensor

  def __tf_flatten__(self) -> tuple[tuple[()], tuple[tf.Tensor, tf.Tensor]]:
    return (), (self.rows, self.reset_rows)

  @classmethod
  def __tf_unflatten__(cls, metadata: Any, components: Any) -> "IndexUpdate":
    del metadata
    return cls(*components)


class VocabularyIndex(tf.Module):
  """The id -> row index of one dynamic table, as TF state and ops.

  A `tf.Module`: a `tf.train.Checkpoint` holding it saves and restores all
  its state (make it, like the table's variables, under the strategy's
  scope). Call `update` once a training step, in cross-replica context,
  with the global batch's ids; `lookup` (evaluation, serving) changes
  nothing.

  State (read it, never write it), for the table's R = `policy.id_rows(
  vocabulary_size)` rows:
    table: int64 id -> int64 row (default -1): the fused kernels'
      `RecsysIdTable` (open addressing) or TF's `MutableHashTable`, one
      interface, one checkpoint format.
    keys: int64 [R]: the id each row holds (kept when a sweep frees it).
    occupied: bool [R]: whether a row holds an id.
    counts: int64 [R]: the id's occurrences since it got the row.
    last_seen: int64 [R]: the step it was last seen.
    sketch_cells: int64 [2 * W]: the count-min sketch of ids without a
      row, hash row r at [r * W, (r + 1) * W) (`sketch`: as [2, W]).
    rows_in_use, admissions, evictions, refused, default_hits: int64
      scalars (`counters()`).
    free_rows, free_head (eviction "age" only): the free rows, ascending,
      are `free_rows[free_head:free_head + R - rows_in_use]`; other
      evictions never free a row, so theirs are `[rows_in_use, R)`.

  Example:
    >>> index = VocabularyIndex("users", 1000, DynamicVocabulary())
    >>> update = index.update(tf.constant(["ann", "bob", "ann"]), step=0)
    >>> update.rows, update.reset_rows   # [0, 1, 0], [0, 1]
    >>> fused = VocabularyIndex("items", 1000, DynamicVocabulary(),
    ...                         fused_ops=kernels.load())   # None: TF ops
  """

  def __init__(
    self,
    table: str,
    vocabulary_size: int,
    policy: DynamicVocabulary,
    name: str | None = None,
    fused_ops: Any = None,
  ) -> None:
    """Makes the index's state (all of it zeros: no id has a row).

    Args:
      table: the table's name, for the errors.
      vocabulary_size: the table's rows (`TableConfig.vocabulary_size`).
      policy: the table's settings.
      name: the module's name (default: "vocabulary_index_<table>").
      fused_ops: the loaded fused CPU kernels (`backends.tensorcore.
        kernels.load()`), whose `recsys_vocabulary_update` then runs
        `update` outside XLA contexts; None: always the TF ops.

    Raises:
      VocabularySettingError: a policy that is not a `DynamicVocabulary`,
        or one the table cannot have (`DynamicVocabulary.check`).
      TypeError: `fused_ops` without `recsys_vocabulary_update` (kernels
        built from older sources).
    """
    if not isinstance(policy, DynamicVocabulary):
      raise VocabularySettingError(
        f"table {table!r}: the dynamic vocabulary is {policy!r}; give a "
        "backends.vocabulary.DynamicVocabulary."
      )
    policy.check(table, vocabulary_size)
    super().__init__(name=name or module_name(table))
    self.table_name = table
    self.vocabulary_size = int(vocabulary_size)
    self.policy = policy
    self.capacity = policy.id_rows(self.vocabulary_size)
    self.sketch_width = policy.sketch_columns(self.vocabulary_size)
    self._sketch_salts = [salt(policy.seed, r) for r in range(_SKETCH_ROWS)]
    self._admit_salt = salt(policy.seed, _ADMIT)
    self._admit_below = int(policy.admit_probability * 2**_LUCKY_BITS)
    self._fused_update: Any = None
    if fused_ops is not None:
      self._fused_update = getattr(fused_ops, "recsys_vocabulary_update", None)
      if self._fused_update is None:
        raise TypeError(
          f"table {table!r}: fused_ops {fused_ops!r} has no "
          "recsys_vocabulary_update; pass backends.tensorcore.kernels.load() "
          "of this source tree (rebuild: make kernels), or None for the "
          "TF ops."
        )
    rows = self.capacity

    def state(name: str, value: Any, dtype: tf.DType = tf.int64) -> tf.Variable:
      # One plain copy on the host, even in a strategy's scope: updated
      # once per step in cross-replica context (`backends.vocabulary.stage`).
      return _tf_internal.host_variable(value, name, dtype)

    with tf.name_scope(self.name):
      self.table = _id_table(fused_ops, rows, f"{self.name}_table")
      self.keys = state("keys", tf.zeros([rows], tf.int64))
      self.occupied = state("occupied", tf.zeros([rows], tf.bool), tf.bool)
      self.counts = state("counts", tf.zeros([rows], tf.int64))
      self.last_seen = state("last_seen", tf.zeros([rows], tf.int64))
      self.sketch_cells = state(
        "sketch_cells", tf.zeros([_SKETCH_ROWS * self.sketch_width], tf.int64)
      )
      self.rows_in_use = state("rows_in_use", 0)
      self.admissions = state("admissions", 0)
      self.evictions = state("evictions", 0)
      self.refused = state("refused", 0)
      self.default_hits = state("default_hits", 0)
      if policy.eviction is Eviction.AGE:
        self.free_rows = state("free_rows", tf.range(rows, dtype=tf.int64))
        self.free_head = state("free_head", 0)

  @property
  def sketch(self) -> tf.Tensor:
    """int64 [2, W]: the count-min sketch (`sketch_cells` as its rows)."""
    return tf.reshape(self.sketch_cells, [_SKETCH_ROWS, self.sketch_width])

  @property
  def default_row(self) -> int | None:
    """The row unknown ids read (the table's last) with unknown
    "unknown_row"; None with "zeros"."""
    return self.policy.unknown_row(self.vocabulary_size)

  def index_bytes(self) -> int:
    """Bytes of state the index holds (`DynamicVocabulary.index_bytes`)."""
    return self.policy.index_bytes(self.vocabulary_size)

  def counters(self) -> dict[str, tf.Tensor]:
    """int64 scalars: rows_in_use, capacity (the rows ids may take),
    admissions, evictions (victims' rows and swept rows), refused and
    default_hits (occurrences left without a row by `update`)."""
    return {
      "rows_in_use": self.rows_in_use.read_value(),
      "capacity": tf.constant(self.capacity, tf.int64),
      "admissions": self.admissions.read_value(),
      "evictions": self.evictions.read_value(),
      "refused": self.refused.read_value(),
      "default_hits": self.default_hits.read_value(),
    }

  def state_shapes(self) -> dict[str, tuple[int, ...]]:
    """Name -> shape of its variables in a checkpoint (under the index)."""
    return {
      n: tuple(v.shape.as_list())
      for n, v in vars(self).items()
      if isinstance(v, tf.Variable)
    }

  def mapping(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(keys int64 [m], rows int64 [m]) of every id with a row, by row
    (e.g. for a serving `tf.lookup.StaticHashTable`)."""
    rows = tf.reshape(tf.where(self.occupied), [-1])
    return tf.gather(self.keys, rows), rows

  # Not converted by autograph (nothing here branches on a tensor in
  # Python): a caller's tf.function traces it ~3x faster.
  @tf.autograph.experimental.do_not_convert
  def lookup(self, ids: tf.Tensor) -> tf.Tensor:
    """int64 [n]: the row of each id (flattened), or -1; changes nothing.

    Raises:
      VocabularyIdsError: ids neither integers nor strings.
    """
    return self._find(self._keys_of(ids))

  def _find(self, keys: tf.Tensor) -> tf.Tensor:
    """The rows of int64 keys [n] (-1: none), with their static shape."""
    return tf.reshape(self.table.lookup(keys), tf.shape(keys))

  @tf.autograph.experimental.do_not_convert
  def update(self, ids: tf.Tensor, step: tf.Tensor) -> IndexUpdate:
    """Counts the ids, admits new ones to rows, evicts; see the module
    docstring for exactly what.

    Args:
      ids: any shape (flattened): int64 or another integer dtype (cast;
        uint64 taken bit for bit), or strings (fingerprinted).
      step: the training step, an integer scalar.

    Returns:
      The rows of the ids and the rows to reset (`IndexUpdate`).

    Raises:
      VocabularyIdsError: ids neither integers nor strings, or a step
        that is not an integer.
    """
    keys = self._keys_of(ids)
    step = self._step_of(step)
    if self._fused_update is not None and not _tf_internal.in_xla_context():
      return self._fused(keys, step)
    with tf.name_scope(self.name):
      unique, position, occurrences = tf.unique_with_counts(
        keys, out_idx=tf.int64
      )
      found = self._find(unique)
      known = found >= 0
      seen_rows = tf.boolean_mask(found, known)
      self.counts.scatter_add(
        tf.IndexedSlices(tf.boolean_mask(occurrences, known), seen_rows)
      )
      self.last_seen.scatter_update(
        tf.IndexedSlices(tf.fill(tf.shape(seen_rows), step), seen_rows)
      )
      if self.policy.eviction is Eviction.AGE:
        self._sweep(step)
      unknown = tf.logical_not(known)
      new_ids = tf.boolean_mask(unique, unknown)
      new_occurrences = tf.boolean_mask(occurrences, unknown)
      candidate = (
        self._count(new_ids, new_occurrences) >= self.policy.admit_after
      )
      if self._admit_below < 2**_LUCKY_BITS:
        candidate = tf.logical_and(candidate, self._lucky(new_ids, step))
      candidates = tf.boolean_mask(new_ids, candidate)
      candidate_occurrences = tf.boolean_mask(new_occurrences, candidate)
      rows = self._admit(candidates, candidate_occurrences, step)
      admitted = tf.size(rows, tf.int64)
      # Each distinct id's row: known ones as found, admitted ones theirs.
      where_new = tf.boolean_mask(tf.range(tf.size(unique, tf.int64)), unknown)
      where_admitted = tf.boolean_mask(where_new, candidate)[:admitted]
      unique_rows = tf.tensor_scatter_nd_update(
        found, where_admitted[:, None], rows
      )
      input_rows = tf.gather(unique_rows, position)
      admitted_occurrences = tf.reduce_sum(candidate_occurrences[:admitted])
      self.refused.assign_add(
        tf.reduce_sum(new_occurrences) - admitted_occurrences
      )
      self.default_hits.assign_add(
        tf.reduce_sum(tf.cast(input_rows < 0, tf.int64))
      )
      return IndexUpdate(rows=input_rows, reset_rows=rows)

  @property
  def fused(self) -> bool:
    """Whether `update` runs the fused op (outside XLA contexts)."""
    return self._fused_update is not None

  def _fused(self, keys: tf.Tensor, step: tf.Tensor) -> IndexUpdate:
    """`update` as one `RecsysVocabularyUpdate` op on this state."""
    (rows,), reset_rows = self._fused_pieces([(keys, None)], step)
    return IndexUpdate(rows=rows, reset_rows=reset_rows)

  @tf.autograph.experimental.do_not_convert
  def update_pieces(
    self, pieces: list[tuple[Any, tf.Tensor | None]], step: tf.Tensor
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """`update` of a batch given in pieces, each `(ids, lengths)`: flat ids
    (`lengths` None: every element an id) or padded bags (ids `[B, W]`,
    lengths `[B]`: the first `lengths[b]` of row `b` are ids), the batch
    their ids in order (a padded piece's row-major).

    Returns each piece's rows in its shape (0 past a padded bag's length),
    and the rows to reset. With the fused op, one op and no copies of the
    batch in TF: no flattening of padded bags, no concat or split.
    """
    step = self._step_of(step)
    shaped = [
      (tf.reshape(self._keys_of(ids), tf.shape(ids)), lengths)
      for ids, lengths in pieces
    ]
    if self._fused_update is not None and not _tf_internal.in_xla_context():
      return self._fused_pieces(shaped, step)
    return pieces_through(self.update, shaped, step)

  def _fused_pieces(
    self, pieces: list[tuple[tf.Tensor, tf.Tensor | None]], step: tf.Tensor
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    age = self.policy.eviction is Eviction.AGE
    none = tf.zeros([0], tf.int64)
    rows, reset_rows = self._fused_update(
      table=self.table.resource_handle,
      keys=self.keys.handle,
      occupied=self.occupied.handle,
      counts=self.counts.handle,
      last_seen=self.last_seen.handle,
      sketch_cells=self.sketch_cells.handle,
      rows_in_use=self.rows_in_use.handle,
      admissions=self.admissions.handle,
      evictions=self.evictions.handle,
      refused=self.refused.handle,
      default_hits=self.default_hits.handle,
      free_list=[self.free_rows.handle, self.free_head.handle] if age else [],
      ids=[ids for ids, _ in pieces],
      lengths=[
        none if lengths is None else tf.cast(lengths, tf.int64)
        for _, lengths in pieces
      ],
      padded=[lengths is not None for _, lengths in pieces],
      step=step,
      eviction=str(self.policy.eviction),
      admit_after=self.policy.admit_after,
      admit_below=self._admit_below,
      sketch_salt_0=_signed(self._sketch_salts[0]),
      sketch_salt_1=_signed(self._sketch_salts[1]),
      admit_salt=_signed(self._admit_salt),
      max_age=self.policy.max_age,
      evict_every=self.policy.evict_every,
      name=f"{self.name}_update",
    )
    return list(rows), reset_rows

  def _keys_of(self, ids: Any) -> tf.Tensor:
    return keys_of(self.table_name, ids)

  def _step_of(self, step: Any) -> tf.Tensor:
    return step_of(self.table_name, step)

  def _count(self, ids: tf.Tensor, occurrences: tf.Tensor) -> tf.Tensor:
    """Adds the ids' occurrences to the sketch; their estimates after."""
    width = tf.constant(self.sketch_width, tf.uint64)
    columns = [
      tf.cast(tf.math.floormod(salted(ids, s), width), tf.int64)
      for s in self._sketch_salts
    ]
    # Flat cells r * W + column: a MirroredVariable has no scatter_nd_add.
    cells = tf.concat(
      [c + r * self.sketch_width for r, c in enumerate(columns)], 0
    )
    self.sketch_cells.scatter_add(
      tf.IndexedSlices(tf.tile(occurrences, [_SKETCH_ROWS]), cells)
    )
    counted = tf.reshape(
      tf.gather(self.sketch_cells, cells), [_SKETCH_ROWS, -1]
    )
    return tf.reduce_min(counted, axis=0)

  def _lucky(self, ids: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """Whether each id wins admission at this step (`admit_probability`)."""
    mixed = tf.bitwise.bitwise_xor(
      salted(ids, self._admit_salt), tf.bitcast(step, tf.uint64)
    )
    draw = tf.bitwise.right_shift(
      _splitmix64(mixed), tf.constant(64 - _LUCKY_BITS, tf.uint64)
    )
    return draw < tf.constant(self._admit_below, tf.uint64)

  def _sweep(self, step: tf.Tensor) -> None:
    """Eviction "age": frees the rows not seen for more than max_age steps
    when `step % evict_every == 0`."""

    def sweep() -> tf.Tensor:
      expired = tf.logical_and(
        self.occupied,
        tf.logical_and(
          tf.not_equal(self.last_seen, step),
          step - self.last_seen > self.policy.max_age,
        ),
      )
      rows = tf.reshape(tf.where(expired), [-1])
      swept = tf.size(rows, tf.int64)

      def free() -> tf.Tensor:
        self.table.remove(tf.gather(self.keys, rows))
        self.occupied.scatter_update(
          tf.IndexedSlices(tf.zeros_like(rows, tf.bool), rows)
        )
        self.rows_in_use.assign_sub(swept)
        self.evictions.assign_add(swept)
        # The free list again: every free row, ascending, from its start.
        occupied = self.occupied.read_value()
        self.free_rows.assign(
          tf.concat(
            [tf.where(tf.logical_not(occupied)), tf.where(occupied)], 0
          )[:, 0]
        )
        self.free_head.assign(0)
        return swept

      return tf.cond(swept > 0, free, lambda: swept)

    every = self.policy.evict_every
    if every == 1:
      sweep()
    else:
      due = tf.equal(tf.math.floormod(step, every), 0)
      tf.cond(due, sweep, lambda: tf.constant(0, tf.int64))

  def _admit(
    self, ids: tf.Tensor, occurrences: tf.Tensor, step: tf.Tensor
  ) -> tf.Tensor:
    """Gives rows to the candidates, in order, while rows last; the rows."""
    wanted = tf.size(ids, tf.int64)
    in_use = self.rows_in_use.read_value()
    fresh = tf.minimum(wanted, self.capacity - in_use)
    if self.policy.eviction is Eviction.AGE:
      head = self.free_head.read_value()
      free = self.free_rows[head : head + fresh]
      self.free_head.assign_add(fresh)
    else:
      free = tf.range(in_use, in_use + fresh)
    victims = tf.zeros([0], tf.int64)
    if self.policy.eviction is not Eviction.NONE:
      victims = tf.cond(
        wanted > fresh,
        lambda: self._victims(wanted - fresh, step),
        lambda: tf.zeros([0], tf.int64),
      )
    rows = tf.concat([free, victims], 0)
    given = tf.size(rows, tf.int64)
    ids, occurrences = ids[:given], occurrences[:given]
    self.table.remove(tf.gather(self.keys, victims))
    self.table.insert(ids, rows)
    self.keys.scatter_update(tf.IndexedSlices(ids, rows))
    self.occupied.scatter_update(
      tf.IndexedSlices(tf.ones_like(rows, tf.bool), rows)
    )
    self.counts.scatter_update(tf.IndexedSlices(occurrences, rows))
    self.last_seen.scatter_update(
      tf.IndexedSlices(tf.fill(tf.shape(rows), step), rows)
    )
    self.rows_in_use.assign_add(fresh)
    self.admissions.assign_add(given)
    self.evictions.assign_add(tf.size(victims, tf.int64))
    return rows

  def _victims(self, wanted: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """Up to `wanted` occupied rows not seen at this step, by (score, row)
    ascending (reads all R rows)."""
    eligible = tf.logical_and(self.occupied, tf.not_equal(self.last_seen, step))
    by = self.counts if self.policy.eviction is Eviction.LFU else self.last_seen
    # top_k takes the largest first and, among equals, the lower index:
    # ~score (= -score - 1, no overflow) puts the smallest score first, and
    # the other rows get the least value. (Only a score of 2**63 - 1 would
    # tie with them: a count never gets there, and a row last seen at step
    # 2**63 - 1 is not eligible at any later step.)
    score = tf.where(eligible, tf.bitwise.invert(by.read_value()), tf.int64.min)
    count = tf.reduce_sum(tf.cast(eligible, tf.int64))
    k = tf.cast(tf.minimum(wanted, count), tf.int32)
    return tf.cast(tf.math.top_k(score, k).indices, tf.int64)


def pieces_through(
  update: Any, pieces: list[tuple[tf.Tensor, tf.Tensor | None]], step: Any
) -> tuple[list[tf.Tensor], tf.Tensor]:
  """`update_pieces` by a flat `update(keys, step) -> IndexUpdate`: the
  pieces' ids flattened and joined, their rows split back into shape."""
  flat = [piece_ids(ids, lengths) for ids, lengths in pieces]
  update = update(tf.concat(flat, 0), step)
  sizes = tf.stack([tf.size(f) for f in flat])
  split = tf.split(update.rows, sizes, num=len(flat))
  rows = [
    piece_rows(part, ids, lengths)
    for part, (ids, lengths) in zip(split, pieces)
  ]
  return rows, update.reset_rows


def _real_lengths(ids: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
  """int64 [B]: how many of each padded row's `W` entries are ids (a bag
  longer than `W` was cut: its length says so, its row holds `W`)."""
  width = tf.shape(ids, out_type=tf.int64)[1]
  return tf.minimum(tf.cast(lengths, tf.int64), width)


def piece_ids(ids: tf.Tensor, lengths: tf.Tensor | None) -> tf.Tensor:
  """A piece's ids as a vector: every element, or a padded piece's first
  `lengths[b]` of each row (all `W` of a cut bag's)."""
  if lengths is None:
    return tf.reshape(ids, [-1])
  real = _real_lengths(ids, lengths)
  return tf.RaggedTensor.from_tensor(ids, lengths=real).flat_values


def piece_rows(
  rows: tf.Tensor, ids: tf.Tensor, lengths: tf.Tensor | None
) -> tf.Tensor:
  """A piece's rows (as `piece_ids` lists them) in the piece's shape
  (padding 0: past each bag's length)."""
  if lengths is None:
    return tf.reshape(rows, tf.shape(ids))
  bags = tf.RaggedTensor.from_row_lengths(
    rows, _real_lengths(ids, lengths), validate=False
  )
  return bags.to_tensor(default_value=0, shape=tf.shape(ids, tf.int64))


class _IdTable(tf.lookup.experimental.MutableHashTable):
  """A `MutableHashTable` (int64 -> int64, default -1) whose resource is
  the fused kernels' `RecsysIdTable`: open addressing, one cache line a
  find where TF's is a chained `std::unordered_map`. TF's lookup ops and
  checkpoints (`-keys`, `-values`) work on it as on TF's table, so a
  checkpoint of either restores into the other."""

  def __init__(self, make: Any, capacity: int, name: str) -> None:
    self._make = make
    self._capacity = capacity
    super().__init__(tf.int64, tf.int64, default_value=-1, name=name)

  def _create_resource(self) -> tf.Tensor:
    handle = self._make(
      shared_name=self._shared_name or "",
      use_node_name_sharing=self._checkpoint and self._shared_name is None,
      key_dtype=tf.int64,
      value_dtype=tf.int64,
      capacity=self._capacity,
      name=self._name,
    )
    self._table_name = (
      None if tf.executing_eagerly() else handle.op.name.split("/")[-1]
    )
    return handle


def _id_table(fused_ops: Any, capacity: int, name: str) -> Any:
  """The index's id -> row table: the kernels' `RecsysIdTable` when they
  have it, else TF's `MutableHashTable`."""
  make = getattr(fused_ops, "recsys_id_table", None)
  if make is None:
    return tf.lookup.experimental.MutableHashTable(
      tf.int64, tf.int64, default_value=-1, name=name
    )
  return _IdTable(make, capacity, name)


def _signed(bits: int) -> int:
  """A uint64 as the int64 of the same bits (an op's int attr)."""
  return bits - 2**64 if bits >= 2**63 else bits


def module_name(table: str) -> str:
  """A valid `tf.Module` name made from a table's name."""
  cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in table)
  if not cleaned or not (cleaned[0].isalpha() or cleaned[0] == "_"):
    cleaned = f"t_{cleaned}"
  return f"vocabulary_index_{cleaned}"


__all__ = [
  "IndexUpdate",
  "VocabularyIdsError",
  "VocabularyIndex",
  "piece_ids",
  "piece_rows",
  "pieces_through",
  "salt",
  "shard_of",
  "splitmix64",
  "step_of",
]
