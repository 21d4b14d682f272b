"""Checkpoint compatibility: does a checkpoint hold exactly these tables?

Every backend writes the layout of TF's mid-level API under its checkpoint
node (`<prefix><table>` and `<prefix><table>.S<slot>`, TF's slot names per
optimizer). TF's own restore assigns whatever matches by name and silently
skips the rest (a renamed table, a slot of another optimizer); a wrong shape
fails with a message that names no table. `verify_compatible` compares the
checkpoint with what the backend expects first and fails with every
difference, naming the table and both shapes; `restore` verifies, then
restores. `verify_objects` does the same for every other variable of a
checkpoint (a model's layers, a dense optimizer's slots), so restoring
another run's checkpoint fails with one list of what differs instead of
TF's first shape error.

A table restored into another dtype is cast (`casting_tables`): exactly
into float32, to nearest into a narrow one. A float32 checkpoint whose
values lie beyond a narrow table's range (float16: +-65504) is refused
before anything is restored (`check_ranges`, `narrow.NarrowRangeError`),
unless asked to saturate them (`restore(..., saturate=True)`, or the
backend option `saturate_restores`).

Example:
  >>> backends.checkpoint.restore(emb, "/tmp/model")   # dir or ckpt prefix
"""

import collections
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from backends import _tf_internal, base
from backends.errors import BackendError
from backends.storage import narrow, row_init, row_sharded_checkpoint

log = logging.getLogger("recsys.backends")

_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_VALUE = "VARIABLE_VALUE"
_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_SLOT_SEPARATOR = ".S"  # how checkpoints escape the "/" of "<table>/<slot>"
_LAYOUTS = _tf_internal.SPARSECORE_LAYOUTS_CHECKPOINT_KEY
#: The checkpoint child of a backend's dynamic-vocabulary indices
#: (`backends.vocabulary.stage.CHECKPOINT_KEY`, a name no table may take).
VOCABULARIES = "vocabularies"


class CheckpointMismatchError(BackendError, ValueError):
  """The checkpoint's tables, slots or other variables differ from this run."""


@dataclasses.dataclass(frozen=True)
class ExpectedTable:
  """What a backend's checkpoint entry for one table looks like."""

  name: str
  shape: tuple[int, int]
  optimizer: str
  slots: tuple[str, ...]


def expected_tables(backend: base.EmbeddingBackend) -> list[ExpectedTable]:
  """The tables and slots `backend` saves and restores, from its config."""
  out = []
  for table in backend.tables:
    opt = backend.optimizer_for(table)
    slots = tuple(_tf_internal.slot_names(opt)) if opt is not None else ()
    out.append(
      ExpectedTable(
        backend.table_name(table),
        (table.vocabulary_size, table.dim),
        type(opt).__name__ if opt is not None else "none",
        slots,
      )
    )
  return out


def _resolve_path(path: str) -> str:
  if os.path.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise FileNotFoundError(
        f"no checkpoint in directory {path!r} (no 'checkpoint' index file)."
      )
    return latest
  return path


def _read(path: str, prefix: str) -> dict[str, tuple[int, ...]]:
  """`{local key: shape}` of the variables under `prefix` in the checkpoint."""
  out = {}
  for key, shape in tf.train.list_variables(path):
    if key.startswith(prefix) and key.endswith(_SUFFIX):
      out[key[len(prefix) : -len(_SUFFIX)]] = tuple(shape)
  return out


def _unescape(local_name: str) -> list[str]:
  """Splits a checkpoint object name on its escaped "/" (".S"); ".." is "."."""
  parts: list[str] = []
  current: list[str] = []
  i = 0
  while i < len(local_name):
    if local_name.startswith(_SLOT_SEPARATOR, i):
      parts.append("".join(current))
      current, i = [], i + 2
    elif local_name.startswith("..", i):
      current.append(".")
      i += 2
    else:
      current.append(local_name[i])
      i += 1
  parts.append("".join(current))
  return parts


def _unstacked(path, prefix, backend, tables, slots):
  """Per-table shapes and slots of a SparseCore (TPUEmbeddingV2) checkpoint.

  V2 checkpoints hold stacked, padded tables and the layouts that say where
  each table lives; only TF's `TPUEmbeddingForServing` (the `serving`
  backend) unstacks them on restore.
  """
  if not backend.unstacks_checkpoints:
    raise CheckpointMismatchError(
      f"checkpoint {path!r} holds SparseCore (TPUEmbeddingV2) stacked tables; "
      f"the {backend.name!r} backend cannot read them. Restore it into the "
      "'serving' backend (with the optimizer, for slots), which unstacks "
      "them, and save that."
    )
  raw = tf.train.load_checkpoint(path).get_tensor(prefix + _LAYOUTS + _SUFFIX)
  layouts = _tf_internal.SparseCoreTableLayouts()
  layouts.ParseFromString(raw)
  out_tables, out_slots = {}, {}
  for layout in layouts.tables:
    shape = tuple(layout.unsharded_shape)
    out_tables[layout.table_name] = shape
    out_slots[layout.table_name] = {
      s: shape for s in slots.get(layout.stacked_table_name, {})
    }
  del tables
  return out_tables, out_slots


def _fmt(shape) -> str:
  return "[" + ", ".join(str(d) for d in shape) + "]"


def verify_compatible(
  checkpoint_path: str,
  backend: base.EmbeddingBackend,
  prefix: str = "embedding/",
  allow_extra_tables: bool = False,
) -> str:
  """Checks that the checkpoint holds exactly the backend's tables and slots.

  Args:
    checkpoint_path: a checkpoint prefix (`.../ckpt-7`) or a directory (its
      latest checkpoint is used).
    backend: the backend to restore into (built or not).
    prefix: the backend's path in the checkpoint's object graph plus "/",
      e.g. "embedding/" for `tf.train.Checkpoint(embedding=backend)`.
    allow_extra_tables: accept tables in the checkpoint the backend lacks.

  Returns:
    The resolved checkpoint prefix.

  Raises:
    CheckpointMismatchError: lists every difference: a table missing from the
      checkpoint (with the tables it has), a table of another shape
      (vocabulary_size, dim) with both shapes, missing or unexpected slots
      (another optimizer), extra tables. Slots the checkpoint has but the
      backend does not use are accepted for lookup-only backends without an
      optimizer (serving exports).
    FileNotFoundError: no checkpoint at `checkpoint_path`.
  """
  path = _resolve_path(checkpoint_path)
  stored = _read(path, prefix)
  if not stored:
    keys = sorted({k.split("/")[0] for k, _ in tf.train.list_variables(path)})
    raise CheckpointMismatchError(
      f"checkpoint {path!r} has no variables under {prefix!r}; its top-level "
      f"objects are {keys}. Pass the prefix the embedding was saved under."
    )
  tables: dict[str, tuple[int, ...]] = {}
  slots: dict[str, dict[str, tuple[int, ...]]] = {}
  # Dynamic table -> its index's state: name -> shape.
  indices: dict[str, dict[str, tuple[int, ...]]] = {}
  for key, shape in stored.items():
    if key.startswith(VOCABULARIES + "/"):
      head = VOCABULARIES + "/tables/"
      if key.startswith(head):
        table, _, variable = key[len(head) :].partition("/")
        indices.setdefault(table, {})[variable] = shape
      continue
    parts = _unescape(key)
    if len(parts) == 2:
      slots.setdefault(parts[0], {})[parts[1]] = shape
    elif len(parts) == 1:
      tables[parts[0]] = shape
  if _LAYOUTS in tables:
    tables, slots = _unstacked(path, prefix, backend, tables, slots)
  problems = []
  lookup_only = backend.lookup_only
  expected = expected_tables(backend)
  stored_desc = ", ".join(f"{n!r} {_fmt(s)}" for n, s in sorted(tables.items()))
  for exp in expected:
    if exp.name not in tables:
      problems.append(
        f"table {exp.name!r} {_fmt(exp.shape)} is not in the checkpoint; it "
        f"has {stored_desc or 'no tables'} (renamed table?)."
      )
      continue
    got = tables[exp.name]
    if got != exp.shape:
      problems.append(
        f"table {exp.name!r}: checkpoint shape {_fmt(got)}, backend shape "
        f"{_fmt(exp.shape)} (vocabulary_size={exp.shape[0]}, dim="
        f"{exp.shape[1]})."
      )
    have = slots.get(exp.name, {})
    missing = [s for s in exp.slots if s not in have]
    extra = sorted(s for s in have if s not in exp.slots)
    if missing or (extra and not (lookup_only and not exp.slots)):
      problems.append(
        f"table {exp.name!r}: the backend's optimizer {exp.optimizer} has "
        f"slots {list(exp.slots)}, the checkpoint has {sorted(have)} "
        "(trained with another optimizer?)."
      )
    for slot in exp.slots:
      if slot in have and have[slot] != exp.shape:
        problems.append(
          f"table {exp.name!r} slot {slot!r}: checkpoint shape "
          f"{_fmt(have[slot])}, backend shape {_fmt(exp.shape)}."
        )
  problems += _index_problems(backend, indices, lookup_only)
  if not allow_extra_tables:
    known = {e.name for e in expected}
    for name in sorted(set(tables) - known):
      problems.append(
        f"the checkpoint has table {name!r} {_fmt(tables[name])}, which the "
        f"backend does not have (its tables: {sorted(known)})."
      )
  if problems:
    raise CheckpointMismatchError(
      f"checkpoint {path!r} (under {prefix!r}) does not match the "
      f"{backend.name!r} backend's tables:\n  - " + "\n  - ".join(problems)
    )
  return path


def _index_problems(
  backend: base.EmbeddingBackend,
  stored: dict[str, dict[str, tuple[int, ...]]],
  lookup_only,
) -> list[str]:
  """What differs between the checkpoint's dynamic-vocabulary indices and
  the backend's: a dynamic table without one, an index for a table that
  takes ids as rows (a lookup-only backend reads such tables: the export
  maps raw ids itself), an index written under another policy (other
  state, or state of other shapes: another sketch width or shard count)."""
  problems = []
  live = {}
  for table, index in backend.dynamic_tables().items():
    live[table] = index.state_shapes()
  for table, names in sorted(live.items()):
    if names and table not in stored:
      problems.append(
        f"table {table!r} is dynamic (EmbeddingPlacement.vocabularies) but "
        "the checkpoint has no index for it: it was trained with its ids "
        "as rows, or hashed. Train it afresh, or leave it static."
      )
    elif names and set(stored[table]) != set(names):
      problems.append(
        f"table {table!r}: the checkpoint's index holds "
        f"{sorted(stored[table])}, this run's {sorted(names)}: written "
        "under another DynamicVocabulary policy (eviction? shards?). Use "
        "the policy it was trained with."
      )
    elif names and stored[table] != names:
      differ = sorted(n for n in names if stored[table][n] != names[n])
      problems.append(
        f"table {table!r}: the checkpoint's index state "
        + ", ".join(
          f"{n} {_fmt(stored[table][n])} (this run's {_fmt(names[n])})"
          for n in differ
        )
        + ": written under another DynamicVocabulary policy (sketch_width? "
        "shards?). Use the policy it was trained with."
      )
  for table in sorted(set(stored) - set(live)):
    if not lookup_only:
      problems.append(
        f"table {table!r} was trained dynamic (raw ids through an index), "
        "but this run's table takes ids as rows: set its "
        "EmbeddingPlacement.vocabularies as it was trained."
      )
  return problems


def _narrowed(variable: tf.Variable, stored: tf.DType) -> str:
  """How a table stored in `stored` comes into `variable`, for the log."""
  if variable.dtype.size < stored.size:
    return "rounded to nearest, saturated at its range"
  return "exact"


def saturates(backend: base.EmbeddingBackend, saturate: bool | None) -> bool:
  """Whether a restore into `backend` saturates values beyond a narrow
  table's range: `saturate`, or (None) the backend's `saturate_restores`
  option (False: refuse them)."""
  if saturate is None:
    return bool(getattr(backend, "saturate_restores", False))
  return bool(saturate)


def _narrowing(
  path: str, backend: base.EmbeddingBackend, prefix: str
) -> dict[str, tuple[str, tf.DType, tf.DType]]:
  """`{table name: (checkpoint key, stored dtype, table dtype)}` of the
  narrow tables that checkpoint `path` holds in a wider dtype (built or
  not: from the backend's `layouts()`)."""
  stored = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  out = {}
  for name, held in backend.layouts().items():
    target = tf.as_dtype(str(held.dtype))
    key = _table_key(prefix, name)
    if (
      narrow.is_narrow(target)
      and key in stored
      and stored[key].size > target.size
    ):
      out[name] = (key, stored[key], target)
  return out


def _beyond_range(
  path: str, key: str, stored: tf.DType, target: tf.DType
) -> tuple[int, float]:
  """`narrow.saturated_in` over a checkpoint tensor: read by row chunks of
  `row_init.CHUNK_BYTES` where it is stored as slices, else whole once
  (as TF's restore reads it)."""
  reader = tf.train.load_checkpoint(path)
  vocab, dim = reader.get_variable_to_shape_map()[key]
  specs = [""]
  if key in row_sharded_checkpoint.sliced_keys(path):
    step = max(1, row_init.CHUNK_BYTES // (stored.size * max(dim, 1)))
    specs = [
      f"{vocab} {dim} {begin},{min(step, vocab - begin)}:-"
      for begin in range(0, vocab, step)
    ]
  count, largest = 0, 0.0
  for spec in specs:
    with tf.device("/cpu:0"):
      value = row_sharded_checkpoint.read_slice(path, key, spec, stored)
    n, big = narrow.saturated_in(np.asarray(value.numpy()), target)
    count, largest = count + n, max(largest, big)
  return count, largest


def check_ranges(
  path: str,
  backend: base.EmbeddingBackend,
  prefix: str = "embedding/",
  saturate: bool | None = None,
) -> dict[str, tuple[int, float]]:
  """Refuses a restore that would saturate values of a narrow table.

  A float32 checkpoint restored into a float16 table turns each value
  beyond +-65504 into +-65504 (a narrow cast saturates, `narrow.cast`):
  that changes the values beyond rounding, so it is refused unless asked
  (`saturates`), before anything is restored; asked, each such table is
  warned of. Reads each such table once more (by row chunks where it is
  sliced).

  Returns:
    `{table: (values beyond its range, the largest magnitude)}` of the
    tables with any.

  Raises:
    narrow.NarrowRangeError: naming each table, the count of values beyond
      its range, the largest, and how to restore anyway.
  """
  found = {}
  for name, (key, stored, target) in _narrowing(path, backend, prefix).items():
    count, largest = _beyond_range(path, key, stored, target)
    if count:
      found[name] = (count, largest, target)
  source = f"checkpoint {path}"
  if found and not saturates(backend, saturate):
    raise narrow.NarrowRangeError(
      "\n".join(
        narrow.range_message(name, target, count, largest, source)
        for name, (count, largest, target) in sorted(found.items())
      )
    )
  for name, (count, largest, target) in sorted(found.items()):
    narrow.warn_saturated_restore(name, target.name, count, largest, source)
  return {name: (count, largest) for name, (count, largest, _) in found.items()}


def _escape(name: str) -> str:
  """A table name as its checkpoint key spells it (`_unescape` reversed)."""
  return name.replace(".", "..").replace("/", _SLOT_SEPARATOR)


def _table_key(prefix: str, name: str) -> str:
  """The checkpoint key of table `name` under `prefix`."""
  return prefix + _escape(name) + _SUFFIX


def _casts(
  path: str,
  backend: base.EmbeddingBackend,
  prefix: str,
  sliced: bool = False,
) -> dict[str, tuple[tf.Variable, tf.DType]]:
  """The built tables whose checkpoint holds them in another dtype:
  `{table name: (variable, stored dtype)}`. Tables saved by slices
  (`backends.storage.row_sharded_checkpoint` reads and casts them) are left out,
  unless
  `sliced` (a restore by TF alone reads them whole)."""
  if not getattr(backend, "_built", False):
    return {}  # restore on create casts as the variables are made
  stored = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  out = {}
  for table, variable in backend.embedding_tables.items():
    name = backend.table_name(table)
    dtype = stored.get(_table_key(prefix, name))
    saves_slices = getattr(variable, "saves_slices", lambda: False)()
    if dtype is not None and dtype != variable.dtype:
      if sliced or not saves_slices:
        out[name] = (variable, dtype)
  return out


def _narrow_into_float32(
  path: str, backend: base.EmbeddingBackend, prefix: str
) -> bool:
  """Whether the checkpoint holds a table in another dtype than float32
  for a backend that stores every table float32 (one not built from
  layouts, `Capabilities.layouts`)."""
  if backend.capabilities.layouts:
    return False  # it creates each table in its dtype, casting a restore
  stored = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  return any(
    stored.get(_table_key(prefix, backend.table_name(t)), tf.float32)
    != tf.float32
    for t in backend.tables
  )


@contextlib.contextmanager
def casting_tables(
  path: str,
  backend: base.EmbeddingBackend,
  prefix: str = "embedding/",
  saturate: bool | None = None,
) -> Iterator[None]:
  """Within it, TF's restore of checkpoint `path` casts the built tables
  that it holds in another dtype (float32 <-> bfloat16/float16).

  TF's restore of an existing variable reads each tensor in the variable's
  dtype and fails on any other ("expected dtype float does not equal
  original dtype bfloat16"). Here each such table reads the tensor in the
  checkpoint's dtype and assigns it cast: float32 into a narrow table
  rounds to nearest, a narrow one into float32 is exact. The slots are
  float32 either way. Restore before `build()` casts without this (the
  variables are created from the checkpoint's value).

  First, values beyond a narrow table's range are refused, or saturated
  with `saturate` (None: the backend's `saturate_restores`;
  `check_ranges`), built or not, before anything is restored.

  Raises:
    narrow.NarrowRangeError: see `check_ranges`.
  """
  check_ranges(path, backend, prefix, saturate)
  casts = _casts(path, backend, prefix)
  _cast_on_restore(path, casts)
  try:
    yield
  finally:
    for variable, _ in casts.values():
      for method in ("_serialize_to_tensors", "_restore_from_tensors"):
        variable.__dict__.pop(method, None)


def _cast_on_restore(
  path: str, casts: dict[str, tuple[tf.Variable, tf.DType]]
) -> None:
  """Has TF's next restore of checkpoint `path` cast each of `casts`
  (`_read_as`), logged per table."""
  for name, (variable, dtype) in casts.items():
    log.info(
      "table %r: checkpoint %s holds it in %s; restoring into %s (%s)",
      name,
      path,
      dtype.name,
      variable.dtype.name,
      _narrowed(variable, dtype),
    )
    _read_as(variable, dtype)


def prepare_restore(
  path: str, backend: base.EmbeddingBackend, saturate: bool | None = None
) -> None:
  """Readies `backend`'s tables for a restore by TF alone of checkpoint
  `path`, wherever in its objects they are (`recsys.layers.Embedding`
  calls it when `model.load_weights` reaches the layer): as
  `casting_tables`, values beyond a narrow table's range refused (or
  saturated, `check_ranges`) and each built table held in another dtype
  read in that dtype and cast, for that restore only.

  The backend's place in the checkpoint is found by its tables' names
  (`backend_prefixes`); several places that hold a table in different
  dtypes are refused (which one is this backend's is not known).

  Raises:
    narrow.NarrowRangeError: see `check_ranges`.
    CheckpointMismatchError: the checkpoint holds this backend's table
      names in several places, in different dtypes.
  """
  prefixes = backend_prefixes(path, backend)
  if not prefixes:
    return
  stored = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  for table in backend.tables:
    name = backend.table_name(table)
    dtypes = {stored[_table_key(p, name)].name for p in prefixes}
    if len(dtypes) > 1:
      raise CheckpointMismatchError(
        f"table {name!r}: checkpoint {path} holds tables of that name in "
        f"{len(prefixes)} places, in {' and '.join(sorted(dtypes))}, so "
        "which is this layer's, and its dtype, is not known. Restore it "
        "with backends.checkpoint.restore(layer.embedding, path, name="
        "<its path in the checkpoint>)."
      )
  for prefix in prefixes:
    check_ranges(path, backend, prefix, saturate)
  _cast_on_restore(path, _casts(path, backend, prefixes[0], sliced=True))


def backend_prefixes(path: str, backend: base.EmbeddingBackend) -> list[str]:
  """The key prefixes (e.g. "layer_with_weights-0/embedding/") under which
  checkpoint `path` holds an object with every one of `backend`'s tables:
  its object graph's nodes whose children include a variable of each
  table's name."""
  reader = tf.train.load_checkpoint(path)
  if not reader.has_tensor(_GRAPH_KEY):
    return []
  graph = _tf_internal.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_GRAPH_KEY))
  names = [backend.table_name(t) for t in backend.tables]
  prefixes = set()
  for node in graph.nodes:
    children = {c.local_name: c.node_id for c in node.children}
    keys = []
    for name in names:
      child = graph.nodes[children[name]] if name in children else None
      values = [
        a.checkpoint_key
        for a in (child.attributes if child is not None else ())
        if a.name == _VALUE
        and a.checkpoint_key.endswith(_escape(name) + _SUFFIX)
      ]
      if not values:
        break
      keys.append(values[0][: -len(_escape(name) + _SUFFIX)])
    if names and len(keys) == len(names) and len(set(keys)) == 1:
      prefixes.add(keys[0])
  return sorted(prefixes)


def _read_as(variable: Any, stored: tf.DType) -> None:
  """Makes TF's next restore read `variable` in `stored` and cast it in
  (`narrow.cast`: saturated at a narrow table's range, checked before by
  `check_ranges`).

  Its own methods are shadowed on the instance for that restore only: each
  shadow removes itself when TF calls it (and `casting_tables` removes
  them when it ends). Until then a save would write the table cast to
  `stored` (the shadow's tensor is the variable's value, cast when read).
  """
  key = _tf_internal.VARIABLE_VALUE_KEY

  def serialize() -> dict[str, Any]:
    variable.__dict__.pop("_serialize_to_tensors", None)
    return {
      key: _tf_internal.SaveSpec(
        lambda: tf.cast(tf.convert_to_tensor(variable), stored),
        "",
        "",
        dtype=stored,
        device="/cpu:0",
      )
    }

  def restore_cast(tensors: dict[str, tf.Tensor]):
    variable.__dict__.pop("_restore_from_tensors", None)
    return variable.assign(narrow.cast(tensors[key], variable.dtype))

  variable._serialize_to_tensors = serialize  # pylint: disable=protected-access
  variable._restore_from_tensors = restore_cast  # pylint: disable=protected-access


def _stored_variables(graph, shapes) -> dict[tuple[str, ...], tuple[int, ...]]:
  """`{object path: shape}` of the variables in a checkpoint's object graph."""
  paths: dict[int, tuple[str, ...]] = {0: ()}
  queue = collections.deque([0])
  while queue:
    node_id = queue.popleft()
    for child in graph.nodes[node_id].children:
      if child.node_id not in paths:
        paths[child.node_id] = paths[node_id] + (child.local_name,)
        queue.append(child.node_id)
  out: dict[tuple[str, ...], tuple[int, ...]] = {}
  for node_id, path in paths.items():
    for attribute in graph.nodes[node_id].attributes:
      if attribute.name == _VALUE and attribute.checkpoint_key in shapes:
        out[path] = tuple(shapes[attribute.checkpoint_key])
  return out


def _live_variables(root) -> dict[tuple[str, ...], tuple[int, ...]]:
  """`{object path: shape}` of the variables reachable from `root`."""
  objects, paths = _tf_internal.breadth_first_objects(root)
  out = {}
  for obj in objects:
    if isinstance(obj, tf.Variable):  # MirroredVariable etc. are Variables too
      out[tuple(ref.name for ref in paths[obj])] = tuple(obj.shape.as_list())
  return out


def verify_objects(
  checkpoint_path: str,
  root: tf.train.Checkpoint,
  skip: Sequence[str] = ("embedding",),
  hint: str = "",
) -> str:
  """Checks that a checkpoint holds exactly `root`'s variables (path, shape).

  TF restores variables by object path and fails on the first shape that
  differs ("Received incompatible tensor with shape ..."), naming neither
  the run nor the other differences, and silently leaves checkpoint values
  that match no object unused. This compares everything first.

  Args:
    checkpoint_path: a checkpoint prefix or a directory (its latest).
    root: the object that will restore it, e.g. `tf.train.Checkpoint(model=...,
      optimizer=..., embedding=backend)`.
    skip: top-level names not compared (the embedding backend's node, which
      `verify_compatible` checks with table-level messages).
    hint: appended to the error, e.g. how to find the configuration that
      wrote the checkpoint.

  Returns:
    The resolved checkpoint prefix.

  Raises:
    CheckpointMismatchError: lists every variable whose shape differs, that
      the checkpoint lacks, or that the checkpoint has under one of `root`'s
      objects but `root` does not (another model or optimizer).
    FileNotFoundError: no checkpoint at `checkpoint_path`.
  """
  path = _resolve_path(checkpoint_path)
  reader = tf.train.load_checkpoint(path)
  if not reader.has_tensor(_GRAPH_KEY):
    raise CheckpointMismatchError(
      f"checkpoint {path!r} has no object graph (written by tf.compat.v1 "
      "Saver?); it cannot be restored into TF2 objects."
    )
  graph = _tf_internal.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_GRAPH_KEY))
  stored = _stored_variables(graph, reader.get_variable_to_shape_map())
  live = _live_variables(root)

  def kept(p):
    return p and p[0] not in skip

  stored = {p: s for p, s in stored.items() if kept(p)}
  live = {p: s for p, s in live.items() if kept(p)}
  roots = {p[0] for p in live}

  def natural(p):
    return [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in p]

  problems = []
  for var_path, shape in sorted(live.items(), key=lambda kv: natural(kv[0])):
    name = "/".join(var_path)
    if var_path not in stored:
      problems.append(f"{name} {_fmt(shape)} is not in the checkpoint")
    elif stored[var_path] != shape:
      problems.append(
        f"{name}: checkpoint shape {_fmt(stored[var_path])}, "
        f"this run {_fmt(shape)}"
      )
  for var_path in sorted(set(stored) - set(live), key=natural):
    if var_path[0] in roots:
      problems.append(
        f"{'/'.join(var_path)} {_fmt(stored[var_path])} is in "
        "the checkpoint but not in this run"
      )
  if problems:
    shown = problems[:20] + (
      [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
    )
    raise CheckpointMismatchError(
      f"checkpoint {path!r} was written by a different configuration: "
      f"{len(problems)} variable(s) differ:\n  - "
      + "\n  - ".join(shown)
      + (f"\n{hint}" if hint else "")
    )
  return path


def restore(
  backend: base.EmbeddingBackend,
  checkpoint_path: str,
  name: str = "embedding",
  allow_extra_tables: bool = False,
  saturate: bool | None = None,
) -> tf.train.Checkpoint:
  """Verifies, then restores the backend's tables and slots from a checkpoint.

  Other objects in the checkpoint (model, optimizer, step) are ignored.
  Before `build()` the values are restored when the variables are created;
  after it, immediately.

  Tables are saved in their own dtype (float32, or a narrow table's
  bfloat16/float16: `backends.storage.narrow`). Restoring into a table of
  another dtype casts (`casting_tables`), built or not: float32 into a narrow
  table rounds to nearest, a narrow table into float32 is exact. (A
  narrow checkpoint restored into an unbuilt TF mid-level backend, e.g.
  `serving`, builds it first: TF's variables cannot cast on creation; so
  does a float32 checkpoint restored into unbuilt narrow tables, whose
  restore honours `saturate` then.) Values beyond a narrow table's range
  (float16: +-65504) are refused before anything is restored, or
  saturated with `saturate` (`check_ranges`).

  Args:
    backend: the backend to restore into.
    checkpoint_path: checkpoint prefix or directory.
    name: the attribute the backend was saved under in the
      `tf.train.Checkpoint`: `tf.train.Checkpoint(embedding=...)` ->
      "embedding".
    allow_extra_tables: see `verify_compatible`.
    saturate: restore values beyond a narrow table's range saturated to
      its largest finite value (with a warning) instead of refusing them;
      None: the backend's `saturate_restores` option.

  Returns:
    The `tf.train.Checkpoint` used (its `restore` status is consumed).

  Raises:
    CheckpointMismatchError: see `verify_compatible`.
    narrow.NarrowRangeError: values beyond a narrow table's range, not
      asked to saturate (`check_ranges`).
  """
  path = verify_compatible(
    checkpoint_path,
    backend,
    prefix=name + "/",
    allow_extra_tables=allow_extra_tables,
  )
  if not getattr(backend, "_built", False) and (
    _narrow_into_float32(path, backend, name + "/")
    or _narrowing(path, backend, name + "/")
  ):
    # TF's mid-level backends create float32 tables and cannot cast a
    # pending restore's value: build, then restore by casting. Narrow
    # tables too: the cast then saturates as this call says.
    backend.build()
  checkpoint = tf.train.Checkpoint(**{name: backend})

  def restore_rest(path):
    status = checkpoint.restore(path)
    status.expect_partial()
    if getattr(backend, "_built", False):
      status.assert_existing_objects_matched()

  # Built row-sharded tables read only their rows, chunk by chunk.
  with casting_tables(path, backend, name + "/", saturate):
    row_sharded_checkpoint.restore(checkpoint, path, restore_rest)
  return checkpoint
