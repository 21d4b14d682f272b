"""Tables in checkpoints, written and read chunk by chunk.

TF saves a variable by reading it whole, and a variable that is updated
sparsely (every embedding table) is copied on every read: a TF save holds a
second copy of every table and slot at once, and a TF restore reads every
tensor of a checkpoint before assigning any. For tables bigger than a host
that cannot work. Here each worker writes the rows it owns of each
row-sharded table (contiguous layout) as row slices of TF's full `<table>`
/ `<table>.S<slot>` tensor, a bundle of at most `row_init.CHUNK_BYTES` at a
time, beside the checkpoint, and the checkpoint's writer merges
them into it (TF's `MergeV2Checkpoints`, which joins slices of one tensor
from many bundles). A restore reads, chunk by chunk, only the rows each
worker owns. Replicated tables and slots (`ReplicatedRows`) go the same
way: written by the process holding the first replica's copy, read chunk
by chunk into every copy, so a restart holds one chunk more than training,
not every table twice.

So the checkpoint is TF's, with the full tensor under TF's key: anything
that reads it whole (a replicated run, the `serving` backend, TF's
`TPUEmbeddingForServing`) reads it as before, and any other replica count
or layout restores its own rows from it by slices.

`save` and `restore` run the protocol around TF's own save and restore of
a `tf.train.Checkpoint` (every worker calls them, as it calls TF's):

  1. TF writes the checkpoint; it records each sliced table's key, no rows;
  2. each worker writes its rows beside the checkpoint (the chief's: a
     shared folder, as every multi-worker checkpoint needs);
  3. once all have (a barrier), the chief merges them in, before the
     checkpoint is recorded as the latest;
  4. a restore: TF restores everything else, each worker reads its rows.

Example:
  >>> path = save(checkpoint, strategy, lambda options:
  ...             manager.save(options=options), chief=True)
  >>> restore(checkpoint, path, checkpoint.restore)
"""

import contextlib
import glob
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from backends import _tf_internal, hardware
from backends.storage import narrow, row_init, row_sharded

log = logging.getLogger("recsys.backends")

rows_outside_tf = row_sharded.rows_outside_tf

_ROWS = ".rows-"  # a rows bundle: <prefix>.rows-<worker>-<chunk>
_OBJECTS = ".objects"  # the checkpoint's own bundle while it is merged


class ReplicatedRows:
  """A replicated table or slot (one variable, a copy on every replica) in
  checkpoints by row chunks: saved from the first replica's copy by the
  process that holds it, restored chunk by chunk into every local copy.

  TF's save reads a variable whole (a sparsely updated one is copied), and
  its restore reads every tensor of a checkpoint before assigning any: a
  restart would hold each table twice.
  """

  def __init__(self, variable: tf.Variable, strategy: tf.distribute.Strategy):
    self.variable = variable
    self._strategy = strategy
    self.shape = variable.shape
    self.dtype = variable.dtype

  def _copies(self) -> list[tf.Variable]:
    return list(self._strategy.experimental_local_results(self.variable))

  def local_chunks(self) -> list[tuple[str, int, int, tf.Variable, int]]:
    """Every row, as `RowShardedVariable.local_chunks` (the first local
    copy stands for the table)."""
    vocab, dim = self.shape.as_list()
    step = row_init.rows_per_chunk(dim, self.dtype)
    first = self._copies()[0]
    return [
      (
        row_sharded.slice_spec(vocab, dim, begin, min(step, vocab - begin)),
        begin,
        min(step, vocab - begin),
        first,
        begin,
      )
      for begin in range(0, vocab, step)
    ]

  def saved_chunks(self) -> list[tuple[str, int, int, tf.Variable, int]]:
    """What this process writes: every row if it holds replica 0, else
    nothing (the rows are that replica's)."""
    if 0 in row_sharded.local_replica_ids(self._strategy):
      return self.local_chunks()
    return []

  def read_chunk(self, copy: tf.Variable, begin: int, count: int):
    return row_sharded.read_rows_of(copy, begin, count)

  def assign_rows(self, begin: int, rows: Any) -> None:
    """Rows `[begin, begin + len(rows))` into every local copy (a scatter:
    a slice assignment would copy a sparsely updated variable whole)."""
    rows = tf.convert_to_tensor(rows, self.dtype)
    indices = tf.range(begin, begin + int(rows.shape[0]), dtype=tf.int64)
    for copy in self._copies():
      with tf.device(copy.device):
        copy.scatter_update(tf.IndexedSlices(rows, indices))

  @contextlib.contextmanager
  def outside_tf(self, save: bool) -> Iterator[None]:
    """TF's save records the variable's key and writes none of its rows
    (`save`), or TF's restore skips it; as `rows_outside_tf` does for a
    `RowShardedVariable`. The variable's own method is shadowed on the
    instance meanwhile (`backends.checkpoint` shadows it to cast, too)."""
    variable, key = self.variable, _tf_internal.VARIABLE_VALUE_KEY
    device = self._copies()[0].device

    def recorded_only() -> dict[str, Any]:
      if not save:
        return {}
      return {
        key: _tf_internal.SaveSpec(
          lambda: None, "", "", dtype=self.dtype, device=device
        )
      }

    shadowed = variable.__dict__.get("_serialize_to_tensors")
    variable._serialize_to_tensors = recorded_only  # pylint: disable=protected-access
    try:
      yield
    finally:
      if shadowed is None:
        variable.__dict__.pop("_serialize_to_tensors", None)
      else:
        variable._serialize_to_tensors = shadowed  # pylint: disable=protected-access


def row_sliced(root: Any) -> dict[str, Any]:
  """`{checkpoint key: rows}` of the tables under `root` saved by slices:
  `RowShardedVariable`s of contiguous shards (and other objects whose
  `saves_slices()` says so), and every replicated table and slot of a
  backend that names them (`replicated_table_variables`), as
  `ReplicatedRows`.

  The keys are TF's: the path a save of `root` gives each object.
  """
  objects, paths = _tf_internal.breadth_first_objects(root)
  replicated = {}
  for obj in objects:
    named = getattr(obj, "replicated_table_variables", None)
    if callable(named):
      for variable in named():
        replicated[id(variable)] = ReplicatedRows(variable, obj.strategy)
  out: dict[str, Any] = {}
  for obj in objects:
    rows = replicated.get(id(obj))
    # A row-sharded table, or anything else saved by slices the same way
    # (a sharded vocabulary index's state: `backends.vocabulary.sharded`).
    saves_slices = getattr(obj, "saves_slices", None)
    if rows is None and callable(saves_slices) and saves_slices():
      rows = obj
    if rows is not None:
      key = _tf_internal.checkpoint_key(
        paths[obj], _tf_internal.VARIABLE_VALUE_KEY
      )
      out[key] = rows
  return out


@contextlib.contextmanager
def _outside_tf(tables: dict[str, Any], save: bool) -> Iterator[None]:
  """TF's save or restore leaves the rows of `tables` to this module."""
  with contextlib.ExitStack() as stack:
    stack.enter_context(rows_outside_tf(save=save, restore=not save))
    for rows in tables.values():
      if isinstance(rows, ReplicatedRows):
        stack.enter_context(rows.outside_tf(save))
    yield


def write_rows(variables: dict[str, Any], prefix: str, worker: int) -> int:
  """Writes this worker's rows of `variables` beside checkpoint `prefix`.

  Row chunks go into bundles (`<prefix>.rows-<worker>-<n>`) of at most
  `row_init.CHUNK_BYTES` (one chunk when a chunk is that big): what is held
  at once is one bundle. Returns the number of bundles written.
  """
  count = 0
  bundle: list[tuple[str, str, tf.Tensor]] = []
  held = 0

  def flush() -> None:
    nonlocal count, held
    if bundle:
      keys, specs, tensors = zip(*bundle)
      tf.raw_ops.SaveV2(
        prefix=f"{prefix}{_ROWS}{worker:05d}-{count:06d}",
        tensor_names=list(keys),
        shape_and_slices=list(specs),
        tensors=list(tensors),
      )
      count += 1
    bundle.clear()
    held = 0

  for key, variable in sorted(variables.items()):
    dim = int(variable.shape[1])
    for spec, _, rows, shard, local in variable.saved_chunks():
      size = rows * dim * variable.dtype.size
      if held and held + size > row_init.CHUNK_BYTES:
        flush()
      bundle.append((key, spec, variable.read_chunk(shard, local, rows)))
      held += size
  flush()
  return count


def merge(prefix: str) -> None:
  """Joins the rows bundles written beside `prefix` into its checkpoint.

  The checkpoint TF wrote at `prefix` becomes one of the merged bundles;
  its data files are renamed, not copied, and the rows bundles' index files
  are removed by the merge.
  """
  parts = sorted(p[: -len(".index")] for p in glob.glob(_rows_pattern(prefix)))
  if not parts:
    return
  objects = prefix + _OBJECTS
  os.replace(prefix + ".index", objects + ".index")
  for data in glob.glob(glob.escape(prefix) + ".data-*"):
    os.replace(data, objects + data[len(prefix) :])
  tf.raw_ops.MergeV2Checkpoints(
    checkpoint_prefixes=[objects] + parts,
    destination_prefix=prefix,
    delete_old_dirs=False,
  )
  log.debug("merged %d rows bundles into %s", len(parts), prefix)


def remove_rows(prefix: str) -> None:
  """Removes rows bundles left beside `prefix` by an interrupted save."""
  for index in glob.glob(_rows_pattern(prefix)):
    base = index[: -len(".index")]
    for path in [index] + glob.glob(glob.escape(base) + ".data-*"):
      try:
        os.remove(path)
      except FileNotFoundError:
        pass


def _rows_pattern(prefix: str) -> str:
  return glob.escape(prefix) + _ROWS + "*.index"


def sliced_keys(path: str) -> set[str]:
  """The keys a checkpoint stores as slices (not as one whole tensor)."""
  listing = tf.train.load_checkpoint(path).debug_string()
  keys = set()
  for line in listing.split(b"\n"):
    # A slice entry: "\0<key>\0<encoded slice> (<dtype>) [<shape>]".
    if line.startswith(b"\x00"):
      keys.add(line[1:].split(b"\x00", 1)[0].decode("utf-8"))
  return keys


def read_slice(path: str, key: str, spec: str, dtype: tf.DType) -> tf.Tensor:
  """The part `spec` of checkpoint tensor `key` (a TF slice spec, e.g.
  "100 8 0,10:-" for rows 0-9 of a [100, 8] tensor; "": all of it), read
  in `dtype`, the dtype it is stored in."""
  return tf.raw_ops.RestoreV2(
    prefix=path, tensor_names=[key], shape_and_slices=[spec], dtypes=[dtype]
  )[0]


def read_rows(
  variables: dict[str, Any],
  path: str,
  stored: dict[str, tf.DType],
) -> None:
  """Restores this worker's rows of `variables` from the checkpoint `path`
  (whose keys' dtypes are `stored`).

  A table stored as slices is read chunk by chunk, only the rows this
  worker owns (TF assembles each requested range from the slices that
  overlap it). A table stored whole (by a replicated run, or TF itself) can
  only be read whole: it is read once and each shard keeps its rows.
  Rows stored in another dtype (a narrow table's bfloat16/float16, or
  float32 into a narrow table) are cast: exact into float32, to nearest
  into a narrow dtype, saturated at its range (`narrow.cast`; a restore
  that would saturate was refused before, unless asked:
  `backends.checkpoint.check_ranges`).
  """
  if not variables:
    return
  sliced = sliced_keys(path)
  for key, variable in sorted(variables.items()):
    dtype = stored.get(key, variable.dtype)
    if dtype != variable.dtype:
      log.info(
        "%s holds %s in %s: cast into %s",
        path,
        key,
        dtype.name,
        variable.dtype.name,
      )
    if key in sliced:
      for spec, begin, _, _, _ in variable.local_chunks():
        value = read_slice(path, key, spec, dtype)
        variable.assign_rows(begin, narrow.cast(value, variable.dtype))
      continue
    log.info("%s holds %s whole: reading it whole once", path, key)
    value = read_slice(path, key, "", dtype)
    variable.assign_rows(0, narrow.cast(value, variable.dtype))


def barrier(strategy: tf.distribute.Strategy) -> None:
  """Returns once every worker of a multi-process `strategy` has called it."""
  if not hardware.is_multi_client(strategy):
    return
  ones = strategy.run(lambda: tf.ones([1]))
  strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)


def save(
  root: Any,
  strategy: tf.distribute.Strategy,
  write: Callable[[tf.train.CheckpointOptions | None], str],
  chief: bool,
  chief_prefix: Callable[[str], str] = lambda path: path,
) -> str:
  """Saves `root` with TF's `write(options)`, sliced tables by their rows.

  Args:
    root: the `tf.train.Checkpoint` `write` saves.
    strategy: the strategy the tables live under (its workers take part).
    write: TF's save of `root` (e.g. a `CheckpointManager.save`), given the
      options that add the rows before the checkpoint is recorded.
    chief: whether this process writes the checkpoint others read.
    chief_prefix: the chief's checkpoint prefix from the one this process
      wrote (a non-chief writes its own copy in a scratch folder).

  Returns:
    What `write` returned.
  """
  tables = row_sliced(root)
  if not tables:
    return write(None)
  worker = min(row_sharded.local_replica_ids(strategy))

  def add_rows(save_path: str) -> None:
    prefix = chief_prefix(save_path)
    if chief:
      remove_rows(prefix)  # an interrupted save's, of any worker
    barrier(strategy)
    write_rows(tables, prefix, worker)
    barrier(strategy)
    if chief:
      merge(prefix)

  options = tf.train.CheckpointOptions(experimental_write_callbacks=[add_rows])
  with _outside_tf(tables, save=True):
    return write(options)


def restore(root: Any, path: str, restore_rest: Callable[[str], Any]) -> Any:
  """Restores `root` from `path`: `restore_rest(path)`, then the rows.

  `restore_rest` is TF's restore of `root` (it skips the sliced tables);
  each worker then reads the rows it owns. Returns what it returned.
  """
  stored = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  # A table the checkpoint holds under another key (SparseCore's stacked
  # tables, unstacked by TF's restore) is left to TF.
  tables = {k: v for k, v in row_sliced(root).items() if k in stored}
  if not tables:
    return restore_rest(path)
  with _outside_tf(tables, save=False):
    result = restore_rest(path)
  read_rows(tables, path, stored)
  return result
