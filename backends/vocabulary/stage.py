"""Raw ids to rows for a backend's dynamic-vocabulary tables, per step.

A backend with dynamic tables runs this stage on every batch before its
lookup (`EmbeddingBackend.map_ids`): each dynamic table's index
(`backends.vocabulary.index.VocabularyIndex`) maps the batch's raw ids to
rows, admits and evicts, and the rows it gives to new ids are reset to
their starting values (table and every optimizer slot) before any lookup
reads them. Other tables' ids pass through untouched.

Where it runs, and why there: a training step's mapping changes the index,
so it must see the whole step's ids in one order whatever the number of
replicas — 1 replica and N replicas on the same global batch must make the
same decisions. It updates once with the ids of every replica, feature by
feature and, within a feature, replica by replica (which is the global
batch's order, since a global batch is split into contiguous replica
shares): called in cross-replica context on a distributed batch, or in a
replica function, from which it `merge_call`s there; on several workers
the ids are first gathered from every worker, so each worker's copy of the
index makes the same decisions. It is never inside an XLA-compiled step or
a TPU's replica step (hash tables have no XLA kernel): the Trainer runs it
on the host, between `next(iterator)` and `strategy.run`, so the step
itself still sees static row ids below the capacity, as a TPU needs.
Evaluation (`training=False`) only reads the index: no merge, no change.

Example (what `map_ids` does in cross-replica context):
  >>> stage = VocabularyStage(tables, layouts, strategy, reset)
  >>> flat_rows = stage.map(distributed_flat_inputs, training=True)
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from backends import _tf_internal, hardware
from backends import inputs as inputs_lib
from backends.vocabulary import hashed, sharded
from backends.vocabulary import index as index_lib

#: The backend's checkpoint child holding every index and the step clock
#: (`vocabularies/tables/<table>/...`, `vocabularies/step`), beside the
#: tables.
CHECKPOINT_KEY = "vocabularies"


def flat_ids(inp: Any) -> tf.Tensor:
  """A feature input's ids as one vector, in row-major order (padding of
  `PaddedBags` left out)."""
  if isinstance(inp, tf.SparseTensor):
    return inp.values
  if isinstance(inp, tf.RaggedTensor):
    return tf.reshape(inp.flat_values, [-1])
  if isinstance(inp, inputs_lib.PaddedBags):
    return index_lib.piece_ids(inp.ids, inp.lengths)
  return tf.reshape(tf.convert_to_tensor(inp), [-1])


def with_ids(inp: Any, rows: tf.Tensor) -> Any:
  """`inp` with its ids (as `flat_ids` lists them) replaced by `rows`."""
  if isinstance(inp, tf.SparseTensor):
    return tf.SparseTensor(inp.indices, rows, inp.dense_shape)
  if isinstance(inp, tf.RaggedTensor):
    values = tf.reshape(rows, tf.shape(inp.flat_values))
    return inp.with_flat_values(values)
  if isinstance(inp, inputs_lib.PaddedBags):
    ids = index_lib.piece_rows(rows, inp.ids, inp.lengths)
    ids.set_shape(inp.ids.shape)  # static as given: a compiled step's input
    return inputs_lib.PaddedBags(ids, inp.lengths, inp.weights)
  inp = tf.convert_to_tensor(inp)
  return tf.reshape(rows, tf.shape(inp))


class VocabularyStage:
  """The dynamic tables' indices, and the per-step mapping of raw ids.

  Args:
    tables: dynamic table name -> `(TableConfig, policy)`: a
      `DynamicVocabulary`, or `HashedIds` (raw ids hashed into the rows).
    table_of_feature: per feature, in the backend's flat feature order,
      its table's name.
    strategy: the backend's strategy (the indices are made in its scope).
    reset: `(table name, rows int64 [k]) -> op` writing the rows' starting
      values into the table and its slots (cross-replica context).
    fused_ops: the backend's loaded fused CPU kernels, or None: the
      `VocabularyIndex`es then update with their one fused op outside XLA
      contexts (same state, same results as their TF ops).
    devices: where the indices live (default: this host's CPU): the step
      clock, the lock and every unsharded index on the first, a sharded
      index's shard `s` on `devices[s % len(devices)]`; parameter-server
      workers share them on the servers.
    concurrent: steps may map at the same time (asynchronous workers):
      each step's update then runs alone, in a `tf.CriticalSection`.
  """

  def __init__(
    self,
    tables: Mapping[str, tuple[Any, Any]],
    table_of_feature: Sequence[str],
    strategy: tf.distribute.Strategy,
    reset: Callable[[str, tf.Tensor], Any],
    fused_ops: Any = None,
    devices: Sequence[str] | None = None,
    concurrent: bool = False,
  ):
    self._strategy = strategy
    self._reset = reset
    self.indices: dict[str, Any] = {}
    with tf.device(devices[0] if devices else None):
      for name, (table, policy) in tables.items():
        policy.check(name, table.vocabulary_size)
        if isinstance(policy, hashed.HashedIds):
          index = hashed.HashedIndex(name, table.vocabulary_size, policy)
        elif policy.shards > 1:
          index = sharded.ShardedIndex(
            name,
            table.vocabulary_size,
            policy,
            fused_ops=fused_ops,
            devices=devices,
            held=_held_shards(strategy, policy),
          )
          if index.apart:  # counters: every worker's shards
            index.counter_sum = self._sum_counters
        else:
          index = index_lib.VocabularyIndex(
            name, table.vocabulary_size, policy, fused_ops=fused_ops
          )
        self.indices[name] = index
      #: Training steps mapped so far: the clock of the indices' ages.
      self.step = _tf_internal.host_variable(0, "vocabulary_step", tf.int64)
      self._lock = (
        tf.CriticalSection(name="vocabularies") if concurrent else None
      )
    self._positions = {
      name: [i for i, t in enumerate(table_of_feature) if t == name]
      for name in self.indices
    }

  @property
  def apart(self) -> bool:
    """Whether worker processes hold different shards of an index: then
    reads, too, map every worker's ids together."""
    return any(getattr(i, "apart", False) for i in self.indices.values())

  def map(self, flat: Sequence[Any], training: bool) -> list[Any]:
    """Per feature, its input with a dynamic table's raw ids made rows.

    In a replica function (or with no strategy) for training, which updates
    the indices once for every replica's ids; anywhere for evaluation
    (with shards apart, every worker maps its evaluation batches together
    too).
    """
    flat = list(flat)
    dynamic = sorted(i for ps in self._positions.values() for i in ps)
    if not dynamic:
      return flat
    raw = [flat[i] for i in dynamic]
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.strategy is not self._strategy:
      ctx = None  # outside the strategy's scope: its cross-replica context
    if _tf_internal.in_xla_context():
      raise ValueError(
        "dynamic-vocabulary tables "
        f"{sorted(self.indices)} map raw ids to rows with hash tables, "
        "which an XLA-compiled step (and a TPU's replica step) cannot "
        "run: map them before the step, in cross-replica context "
        "(backend.map_ids outside strategy.run, as the Trainer does), or "
        "compile without jit_compile."
      )
    if not training and not self.apart:
      mapped = _per_local_replica(
        lambda part: self._looked_up(part, dynamic), raw
      )
    elif ctx is None:  # cross-replica context (on the host, before a step)
      mapped = self._merged(self._strategy, raw, dynamic, training)
    else:
      mapped = ctx.merge_call(self._merged, args=(raw, dynamic, training))
    for i, value in zip(dynamic, mapped):
      flat[i] = value
    return flat

  def _merged(
    self, strategy, raw: list[Any], positions: list[int], training=True
  ):
    """Cross-replica: update the indices with every replica's ids (or,
    not `training`, read them); each replica gets its own inputs back as
    rows."""
    per_replica = _local_replica_parts(raw)
    gathered = hardware.synchronous_processes(strategy) > 1
    out = [list(x) for x in per_replica]
    planned = []
    for table, index in self.indices.items():
      mine = [k for k, p in enumerate(positions) if p in self._positions[table]]
      # Feature by feature, replica by replica: the global batch's order.
      where = [(r, k) for k in mine for r in range(len(per_replica))]
      inputs = [per_replica[r][k] for r, k in where]
      if gathered:
        # Every worker's ids (padded bags padded: the same shapes on every
        # worker); this worker keeps its replicas' rows.
        pieces, own = _gather_workers(
          strategy, [_as_piece(x) for x in inputs], len(mine)
        )
      else:
        # Padded bags stay padded: no flattening around the update.
        pieces, own = [_as_piece(x) for x in inputs], None
      planned.append((table, index, where, inputs, pieces, own))

    def update() -> list[tf.Tensor]:
      """Every table's update, the resets and the clock: one step."""
      updated = []
      for table, index, where, inputs, pieces, own in planned:
        if training:
          rows, reset_rows = index.update_pieces(pieces, self.step)
        else:
          rows = [_read_piece(index, ids, lengths) for ids, lengths in pieces]
          reset_rows = tf.zeros([0], tf.int64)
        if getattr(index, "apart", False):
          rows, count = self._from_holders(rows, pieces)
          if training:
            # At most one row a step's id: padded to the ids' count, every
            # worker's part is as long (see `_gather_parts`).
            reset_rows = _join_over_workers(self._strategy, reset_rows, count)
        if own is not None:
          rows = [rows[j] for j in own]
        updated.append(_Mapped(table, index, where, inputs, rows, reset_rows))
      reset = _reset_if_any(
        self._reset,
        {
          u.table: u.reset_rows
          for u in updated
          if u.reset_rows.shape.num_elements() != 0  # hashed: never any
        },
      )
      done = []
      with tf.control_dependencies([reset]):
        for u in updated:
          for mapped in u.rows:
            done.append(tf.identity(_with_default(mapped, u.index.default_row)))
      if not training:
        return done
      with tf.control_dependencies(done):
        advance = self.step.assign_add(1)
      with tf.control_dependencies([advance]):
        return [tf.identity(x) for x in done]

    # Concurrent callers (parameter-server workers) take turns: one step's
    # update, resets and clock at a time.
    mapped = self._lock.execute(update) if self._lock else update()
    mapped = iter(mapped)
    for _, _, where, inputs, _, _ in planned:
      for (r, k), inp in zip(where, inputs):
        out[r][k] = _with_rows(inp, next(mapped))
    if len(out) == 1:
      return out[0]
    return _tf_internal.regroup(tuple(out))

  def _from_holders(
    self, rows: list[tf.Tensor], pieces: list[tuple[Any, Any]]
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Every worker's ids' rows from the workers holding their shards:
    each id's row is `NOT_HELD` on all workers but its shard's holder, so
    a sum over the workers of `row + 2` (0 where not held), less 2, is
    it (-1: no row). Returns the rows in the pieces' shapes and the
    pieces' entries (a bound of the step's ids).

    Padded bags are summed whole, their padding as 0 (row 0 after, as
    `piece_rows` gives): a collective's size must not change from step to
    step (in a loop of steps, one whose size varied met another step's
    on the other worker: `_gather_parts`).
    """
    flat, real = [], []
    for r, (_, lengths) in zip(rows, pieces):
      flat.append(tf.reshape(r, [-1]))
      if lengths is None:
        real.append(tf.ones_like(flat[-1], tf.bool))
      else:
        width = tf.shape(r, out_type=tf.int64)[1]
        kept = tf.minimum(tf.cast(lengths, tf.int64), width)
        real.append(tf.reshape(tf.sequence_mask(kept, width), [-1]))
    flat, real = tf.concat(flat, 0), tf.concat(real, 0)
    held = tf.logical_and(real, flat != sharded.NOT_HELD)
    summed = _sum_over_workers(
      self._strategy, tf.where(held, flat + 2, tf.zeros_like(flat))
    )
    found = tf.where(real, summed - 2, tf.zeros_like(summed))
    sizes = [r.shape.num_elements() for r in rows]
    if None in sizes:
      sizes = tf.stack([tf.size(r) for r in rows])
    parts = tf.split(found, sizes, num=len(rows))
    back = [tf.reshape(p, tf.shape(r)) for p, r in zip(parts, rows)]
    return back, tf.size(flat, tf.int64)

  def _sum_counters(self, counters: dict[str, tf.Tensor]) -> dict:
    """Int64 counters summed over the workers (each worker calls it)."""
    names = sorted(counters)
    summed = _sum_over_workers(
      self._strategy, tf.stack([counters[n] for n in names])
    )
    return dict(zip(names, tf.unstack(summed)))

  def _looked_up(self, raw: list[Any], positions: list[int]) -> list[Any]:
    """Evaluation: every input's ids as rows, the indices unchanged."""
    out = list(raw)
    for table, index in self.indices.items():
      for k, p in enumerate(positions):
        if p in self._positions[table]:
          rows = _read_piece(index, *_as_piece(raw[k]))
          out[k] = _with_rows(raw[k], _with_default(rows, index.default_row))
    return out

  def trackable(self) -> Any:
    """One checkpoint node: each table's index under "tables/<table>",
    the step clock under "step"."""
    tables = _tf_internal.AutoTrackable()
    for name, index in self.indices.items():
      _tf_internal.track_child(tables, index, name)
    node = _tf_internal.AutoTrackable()
    _tf_internal.track_child(node, tables, "tables")
    _tf_internal.track_child(node, self.step, "step")
    return node

  def counters(self) -> dict[str, dict[str, tf.Tensor]]:
    """Table name -> its index's counters (`VocabularyIndex.counters`)."""
    return {name: index.counters() for name, index in self.indices.items()}


class _Mapped(NamedTuple):
  """One table's update in a step: where its inputs were (replica,
  feature), the inputs, each one's rows, and the rows to reset."""

  table: str
  index: Any
  where: list[tuple[int, int]]
  inputs: list[Any]
  rows: list[tf.Tensor]
  reset_rows: tf.Tensor


def _local_replicas(raw: Any) -> int:
  """How many local replicas' values `raw` holds: its distributed values'
  components, or 0 when it holds none (one local replica, or plain tensors
  in cross-replica context, which are one replica's)."""
  for x in tf.nest.flatten(raw):
    if isinstance(x, tf.distribute.DistributedValues):
      return len(x.values)
  return 0


def _local_replica_parts(raw: Any) -> list:
  """`raw`'s part of each local replica (what a merge function or a
  cross-replica step gets), or `raw` whole when it is not distributed."""
  replicas = _local_replicas(raw)
  if not replicas:
    return [raw]
  return [_tf_internal.select_replica(r, raw) for r in range(replicas)]


def _per_local_replica(fn: Callable[[Any], Any], raw: Any) -> Any:
  """`fn` of each local replica's part of `raw`, regrouped (plain when
  `raw` holds no distributed values)."""
  if not _local_replicas(raw):
    return fn(raw)
  return _tf_internal.regroup(tuple(fn(p) for p in _local_replica_parts(raw)))


def _as_piece(inp: Any) -> tuple[tf.Tensor, tf.Tensor | None]:
  """A feature input as `update_pieces` takes it: padded bags as they are
  (ids, lengths), any other input's ids as a vector."""
  if isinstance(inp, inputs_lib.PaddedBags):
    return _as_id_vector(inp.ids), inp.lengths
  return _as_id_vector(flat_ids(inp)), None


def _with_rows(inp: Any, rows: tf.Tensor) -> Any:
  """`inp` with the rows `update_pieces` gave its piece as its ids (padded
  bags' in their shape, or flat as `flat_ids` lists them)."""
  if isinstance(inp, inputs_lib.PaddedBags) and rows.shape.rank == 2:
    rows = tf.ensure_shape(rows, inp.ids.shape)  # a compiled step's input
    return inputs_lib.PaddedBags(rows, inp.lengths, inp.weights)
  return with_ids(inp, rows)


def _as_id_vector(ids: tf.Tensor) -> tf.Tensor:
  """Integer ids as int64 (strings pass: the index fingerprints them)."""
  if ids.dtype in (tf.int32, tf.int16, tf.int8, tf.uint8, tf.uint16):
    return tf.cast(ids, tf.int64)
  return ids


def _reset_if_any(
  reset: Callable[[str, tf.Tensor], Any], rows: Mapping[str, tf.Tensor]
) -> tf.Tensor:
  """`reset(table, rows)` of every table, only at a step that gave rows to
  new ids: most steps of warm tables give none, and the starting values'
  ~40 ops cost ~0.3 ms a table even for no rows (one condition for all
  tables: each costs a function call)."""
  if not rows:
    return tf.constant(False)

  def write() -> tf.Tensor:
    with tf.control_dependencies([reset(t, r) for t, r in rows.items()]):
      return tf.constant(True)

  given = tf.add_n([tf.size(r) for r in rows.values()])
  return tf.cond(given > 0, write, lambda: tf.constant(False))


def _with_default(rows: tf.Tensor, default_row: int | None) -> tf.Tensor:
  """-1 (no row) as the table's unknown row, or kept (left out of bags)."""
  if default_row is None:
    return rows
  return tf.where(rows < 0, tf.constant(default_row, tf.int64), rows)


def _worker(strategy: tf.distribute.Strategy) -> int:
  """This worker's index among the processes of a multi-worker strategy
  (its first replica's global id over its local replicas)."""
  from backends.storage import row_sharded  # noqa: PLC0415 - no cycle

  ids = row_sharded.local_replica_ids(strategy)
  return min(ids) // len(ids)


def _held_shards(strategy: tf.distribute.Strategy, policy: Any) -> list[int]:
  """The shards of `policy`'s index this process holds
  (`DynamicVocabulary.held_shards`): all of them in one process."""
  workers = hardware.synchronous_processes(strategy)
  worker = 0 if workers == 1 else _worker(strategy)
  return policy.held_shards(worker, workers)


def _per_worker(strategy: tf.distribute.Strategy, value: tf.Tensor, empty):
  """A per-replica value: `value` on this worker's first local replica,
  `empty` on its others (so that a gather takes it once a worker)."""
  from backends.storage import row_sharded  # noqa: PLC0415 - no cycle

  local = len(row_sharded.local_replica_ids(strategy))
  return _tf_internal.regroup((value,) + (empty,) * (local - 1))


def _sum_over_workers(
  strategy: tf.distribute.Strategy, value: tf.Tensor
) -> tf.Tensor:
  """An int64 vector summed over the worker processes (a gather of one
  row a worker, then a sum: exact)."""
  row = tf.reshape(value, [1, -1])
  every = strategy.gather(
    _per_worker(strategy, row, tf.zeros([0, tf.size(value)], value.dtype)),
    axis=0,
  )
  return tf.reshape(tf.reduce_sum(every, 0), tf.shape(value))


def _join_over_workers(
  strategy: tf.distribute.Strategy, rows: tf.Tensor, bound: tf.Tensor
) -> tf.Tensor:
  """Every worker's rows (int64 >= 0, at most `bound` a worker, the same
  `bound` on every worker), worker after worker: each padded to `bound`
  with -1 for the gather, the padding dropped after."""
  padded = tf.pad(
    rows, [[0, bound - tf.size(rows, tf.int64)]], constant_values=-1
  )
  every = strategy.gather(
    _per_worker(strategy, padded, tf.zeros([0], rows.dtype)), axis=0
  )
  return tf.boolean_mask(every, every >= 0)


def _gather_workers(
  strategy: tf.distribute.Strategy, pieces: list[tuple[Any, Any]], features: int
) -> tuple[list[tuple[Any, Any]], list[int]]:
  """Every replica's pieces `(ids, lengths)` of every worker, feature by
  feature in global replica order; and which of them are this worker's.

  `pieces` holds this worker's pieces feature-major (`features` features
  times the local replicas). Returns `(pieces, own)` over all replicas.
  """
  from backends.storage import row_sharded  # noqa: PLC0415 - no cycle

  local = len(pieces) // features
  global_ids = row_sharded.local_replica_ids(strategy)
  total = strategy.num_replicas_in_sync
  out, own = [], []
  for f in range(features):
    mine = pieces[f * local : (f + 1) * local]
    ids = _gather_parts(strategy, [i for i, _ in mine], total)
    lengths: list[Any] = [None] * total
    if mine[0][1] is not None:
      lengths = _gather_parts(strategy, [n for _, n in mine], total)
    for g in range(total):
      out.append((ids[g], lengths[g]))
      if g in global_ids:
        own.append(f * total + g)
  return out, own


def _read_piece(index: Any, ids: tf.Tensor, lengths: Any) -> tf.Tensor:
  """An index's rows of one piece, read only, in the piece's shape."""
  if lengths is None:
    return tf.reshape(index.lookup(ids), tf.shape(ids))
  rows = index.lookup(index_lib.piece_ids(ids, lengths))
  return index_lib.piece_rows(rows, ids, lengths)


def _gather_parts(
  strategy: tf.distribute.Strategy, parts: list[tf.Tensor], total: int
) -> list[tf.Tensor]:
  """Each replica's tensor of every worker (this worker's: `parts`, one a
  local replica), in global replica order.

  Tensors of one static shape (padded bags, a batch of ids: what the
  Trainer's steps map) are gathered as they are. TF's gather of tensors of
  unequal lengths (flat ids of bags of varying lengths) mismatched between
  the workers inside a loop of several steps (a shape mismatch in its
  collective; 2 worker processes, `train.steps_per_loop` > 1; one step at
  a time it matched): only tensors of unknown shape take it.
  """
  shape = parts[0].shape
  if shape.is_fully_defined() and all(p.shape == shape for p in parts):
    every = strategy.gather(_tf_internal.regroup(tuple(parts)), axis=0)
    return tf.split(every, total, axis=0)
  sizes = strategy.gather(
    _tf_internal.regroup(
      tuple(tf.reshape(tf.shape(p, out_type=tf.int64)[0], [1]) for p in parts)
    ),
    axis=0,
  )
  every = strategy.gather(_tf_internal.regroup(tuple(parts)), axis=0)
  return tf.split(every, tf.cast(sizes, tf.int32), num=total)
