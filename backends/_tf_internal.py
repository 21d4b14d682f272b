"""The TensorFlow internals the backends use, in one place.

TensorFlow exports no public API for these: the trackable protocol the
backends' checkpoints follow, the XLA and tape questions a step asks, the
TPU embedding optimizers' slots, the mid-level API's CPU copies of its
tables, and the checkpoint protos. Every `tensorflow.python` /
`tensorflow.core` import of `backends/` is here (a test fails if one
appears elsewhere), and `tests/backends/test_tf_internal.py` fails naming
the symbol when a TensorFlow upgrade removes or changes one, so an upgrade
is one file to audit. What TF does export (`tf.nest`,
`tf.tpu.experimental.embedding`) the backends take from `tf` itself.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.core import config as autograph_config  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.checkpoint import graph_view  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.distribute import (
  cross_device_ops,  # pylint: disable=g-direct-tensorflow-import
  distribute_utils,  # pylint: disable=g-direct-tensorflow-import
  mirrored_strategy,  # pylint: disable=g-direct-tensorflow-import
  sharded_variable,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.eager import (
  record,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.eager import (
  tape as tape_lib,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import (
  collective_ops,  # pylint: disable=g-direct-tensorflow-import
  control_flow_util,  # pylint: disable=g-direct-tensorflow-import
  resource_variable_ops,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.saved_model import registration  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import (
  autotrackable,  # pylint: disable=g-direct-tensorflow-import
  data_structures,  # pylint: disable=g-direct-tensorflow-import
  trackable_utils,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.trackable import (
  base as trackable_base,  # pylint: disable=g-direct-tensorflow-import
)
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

# -- the trackable protocol (checkpoints of the backends' own objects) --------

#: The base of every backend: tracks the variables assigned to attributes.
AutoTrackable = autotrackable.AutoTrackable
#: The base of an object that saves its own tensors (`RowShardedVariable`).
Trackable = trackable_base.Trackable
#: Wraps an attribute value that must not become a checkpoint dependency.
NoDependency = data_structures.NoDependency
#: `_trackable_children`'s `save_type` (checkpoint or SavedModel).
SaveType = trackable_base.SaveType
#: The key a variable-like object saves its value under.
VARIABLE_VALUE_KEY = trackable_base.VARIABLE_VALUE_KEY
#: The initial value a restore-on-create passes (reads the checkpoint).
CheckpointInitialValueCallable = trackable_base.CheckpointInitialValueCallable
#: The value a pending restore gives a variable it creates (restore on
#: create), read in the checkpoint's dtype: `wrapped_value`.
CheckpointInitialValue = trackable_base.CheckpointInitialValue
#: The slice of a full tensor one shard restores (`shape`, `offset`).
ShardInfo = trackable_base.ShardInfo
#: What a trackable saves; with a callable giving None, an attribute whose
#: key is recorded in the object graph but whose value is written apart.
SaveSpec = saveable_object.SaveSpec
#: A parameter-server variable split into row shards.
ShardedVariable = sharded_variable.ShardedVariable


def trackable_children(obj: Any, save_type: Any, **kwargs: Any) -> dict:
  """`obj`'s checkpoint children `{name: trackable}` (TF's protocol)."""
  return obj._trackable_children(save_type, **kwargs)  # pylint: disable=protected-access


def lookup_dependency(obj: Any, name: str) -> Any:
  """`obj`'s checkpoint child called `name`, or None."""
  return obj._lookup_dependency(name)  # pylint: disable=protected-access


def deferred_restores(obj: Any) -> dict[str, list[Any]]:
  """The restores queued on `obj` for children it has not created yet.

  `checkpoint.restore()` queues them by child name; `obj` restores each as
  it creates the child (`_add_variable_with_custom_getter`). The dict is
  `obj`'s own: adding to it hands restores over to `obj`.
  """
  obj._maybe_initialize_trackable()  # pylint: disable=protected-access
  return obj._deferred_dependencies  # pylint: disable=protected-access


def variable_adder(obj: Any) -> Callable[..., Any]:
  """`obj`'s `(name, initializer, shape, getter, trainable) -> variable`:
  makes a variable through `getter` and tracks it as `obj`'s child `name`,
  restored on creation from a restore pending on `obj`."""
  return obj._add_variable_with_custom_getter  # pylint: disable=protected-access


def host_variable(
  initial_value: Any, name: str, dtype: Any = None
) -> tf.Variable:
  """A plain (not distributed) non-trainable variable on this host's CPU,
  even inside a strategy's scope: state updated once per step in
  cross-replica context (a dynamic table's index), which a mirrored copy
  per replica would only multiply (and `MirroredVariable` lacks
  `scatter_nd_add`). A `ResourceVariable` made directly skips the
  strategies' variable creators."""
  with tf.device("/cpu:0"):
    return resource_variable_ops.ResourceVariable(
      initial_value, dtype=dtype, trainable=False, name=name
    )


def select_replica(replica: int, structure: Any) -> Any:
  """Replica `replica`'s (local index) component of every distributed
  value in `structure` (what a merge function gets from `merge_call`)."""
  return distribute_utils.select_replica(replica, structure)


def regroup(per_replica: tuple[Any, ...]) -> Any:
  """One structure of distributed values from one structure per local
  replica (what `merge_call` hands back to each replica as its own)."""
  return distribute_utils.regroup(per_replica)


def track_child(obj: Any, child: Any, name: str) -> Any:
  """Tracks `child` (any trackable) as `obj`'s checkpoint child `name`."""
  return obj._track_trackable(child, name=name)  # pylint: disable=protected-access


def breadth_first_objects(root: Any) -> tuple[list[Any], dict[Any, Any]]:
  """Every object a checkpoint of `root` reaches, and each one's path.

  The path is a list of references with a `.name` each, from `root` down.
  """
  objects, paths = graph_view.ObjectGraphView(root).breadth_first_traversal()
  return list(objects), paths


def register_checkpoint_saver(
  package: str,
  name: str,
  predicate: Callable[[Any], bool],
  save_fn: Callable[..., Any],
  restore_fn: Callable[..., Any],
  strict_predicate_restore: bool = True,
) -> None:
  """Registers callbacks run when a checkpoint saves / restores an object
  that `predicate` accepts (TF registers the same for its `TPUEmbedding`)."""
  registration.register_checkpoint_saver(
    package=package,
    name=name,
    predicate=predicate,
    save_fn=save_fn,
    restore_fn=restore_fn,
    strict_predicate_restore=strict_predicate_restore,
  )


# -- checkpoint files ------------------------------------------------------

#: The proto of a TF2 checkpoint's object graph (the tensor
#: `_CHECKPOINTABLE_OBJECT_GRAPH`).
TrackableObjectGraph = trackable_object_graph_pb2.TrackableObjectGraph
#: The proto of the stacked-table layouts a SparseCore checkpoint holds.
SparseCoreTableLayouts = sparse_core_layout_pb2.SparseCoreTableLayouts
#: The checkpoint key (under the embedding's node) of those layouts.
SPARSECORE_LAYOUTS_CHECKPOINT_KEY = (
  tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY
)


# -- nested structures: what `tf.nest` does not export --------------------


def flatten_with_joined_string_paths(structure: Any) -> list[tuple[str, Any]]:
  """`[(path, leaf)]` of `structure`, paths joined with "/" (`"a/0/b"`)."""
  return nest.flatten_with_joined_string_paths(structure)


def flatten_up_to(shallow: Any, structure: Any) -> list[Any]:
  """`structure` flattened only as deep as `shallow` (leaves may be
  structures themselves); types are not compared, only the nesting."""
  return nest.flatten_up_to(shallow, structure, check_types=False)


# -- AutoGraph: the project's code is traced as written ---------------------

#: The project's packages, which AutoGraph leaves as written.
UNCONVERTED_PACKAGES = ("backends", "recsys")


def leave_project_code_unconverted() -> None:
  """AutoGraph traces the project's functions as written, not rewritten.

  Keras converts a layer's `call` (and a `tf.function` converts what its
  function calls) into AutoGraph's code, module by module, unless TF's
  conversion rules exclude the module, as they do TF and Keras. The
  project's code has no data-dependent Python control flow (`tf.cond` and
  `tf.while_loop` where it needs one; a tensor used as a bool fails the
  trace loudly), so converting it only costs: ~0.6 of the ~6 CPU-seconds a
  short `recsys train` run takes. A `tf.function` the project defines
  keeps its own `autograph=` for its body.
  """
  rules = tuple(autograph_config.CONVERSION_RULES)
  new = tuple(
    autograph_config.DoNotConvert(name)
    for name in UNCONVERTED_PACKAGES
    if not any(
      isinstance(rule, autograph_config.DoNotConvert) and rule.matches(name)
      for rule in rules
    )
  )
  autograph_config.CONVERSION_RULES = new + rules


leave_project_code_unconverted()


# -- the step: XLA, tapes, resource variables ------------------------------


def in_xla_context() -> bool:
  """Whether ops are being traced for XLA (`jit_compile`, a TPU).

  A compiled step cannot check at run time with `tf.debugging.Assert` or
  fall back to the CPU kernels.
  """
  graph = ops.get_default_graph()
  return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def _collective_launcher(replica_context: Any) -> Any:
  """This replica's launcher of TF's collective ops (their group and
  instance keys, ordering token and device) under `MirroredStrategy` and
  `MultiWorkerMirroredStrategy`, or None."""
  extended = replica_context.strategy.extended
  collective = getattr(extended, "_collective_ops", None)
  if not isinstance(collective, cross_device_ops.CollectiveAllReduce):
    collective = getattr(extended, "_cross_device_ops", None)
  if not isinstance(collective, cross_device_ops.CollectiveAllReduce):
    return None
  return collective._launchers[replica_context._replica_id]  # pylint: disable=protected-access


def _follow_merge_call(replica_context: Any) -> None:
  """MirroredStrategy traces each replica in a thread of its own, one at a
  time between merge calls, and chains every replica's assertions in that
  order: a collective launched from a replica thread must follow a merge
  call, or an assertion after one replica's collective would run before
  the other replica's could start."""
  if not tf.executing_eagerly() and not in_xla_context():
    replica_context.merge_call(lambda _: None)


def _is_tpu(strategy: Any) -> bool:
  return isinstance(
    strategy,
    (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy),
  )


def all_to_all(replica_context: Any, value: Any) -> Any:
  """Replica `r` sends `value[i]` to replica `i`, receives `value[r]` of each.

  `value` is `[R, ...]` (R: the replicas in sync), the same shape on every
  replica; the result has that shape, its row `i` from replica `i`, in a
  traced step. The replica context offers all-reduce and all-gather only:
  this is TF's own collective all-to-all, launched with the strategy's
  group and instance keys and its ordering token (so it runs in program
  order with the context's other collectives), under `MirroredStrategy`
  and `MultiWorkerMirroredStrategy`; the TPU's `AllToAll` in a TPU step.

  Raises:
    NotImplementedError: a strategy with neither (e.g. parameter servers).
  """
  strategy = replica_context.strategy
  replicas = strategy.num_replicas_in_sync
  if replicas == 1:
    return value
  launcher = _collective_launcher(replica_context)
  if launcher is not None:
    _follow_merge_call(replica_context)
    with ops.device(launcher._device):  # pylint: disable=protected-access
      return collective_ops.all_to_all_v2(
        value,
        launcher._group_size,  # pylint: disable=protected-access
        launcher._group_key,  # pylint: disable=protected-access
        launcher._next_instance_key(),  # pylint: disable=protected-access
        ordering_token=launcher._get_ordering_token(),  # pylint: disable=protected-access
      )
  if _is_tpu(strategy):
    return tf.raw_ops.AllToAll(
      input=value,
      group_assignment=[list(range(replicas))],
      concat_dimension=0,
      split_dimension=0,
      split_count=replicas,
    )
  raise NotImplementedError(
    f"{type(strategy).__name__} offers no all-to-all between its replicas."
  )


def summed_when(
  replica_context: Any,
  condition: tf.Tensor,
  value_fn: Callable[[], Any],
  spec: tf.TensorSpec,
) -> Any:
  """`value_fn()` (of `spec`'s shape and dtype) summed over the replicas
  where `condition` holds, zeros where it does not: the value computed and
  the collective run only when it holds.

  `condition` is a scalar bool that must be the same on every replica (a
  function of all-reduced values): a replica skipping a collective the
  others run would leave them waiting. The replica context's own
  `all_reduce` is a merge call, which TF refuses inside control flow; this
  launches TF's collective all-reduce (`MirroredStrategy`,
  `MultiWorkerMirroredStrategy`) or the TPU's `CrossReplicaSum` inside a
  `tf.cond`. Any other strategy, or eager execution (MirroredStrategy then
  runs its replicas one at a time), sums every step.
  """
  strategy = replica_context.strategy
  replicas = strategy.num_replicas_in_sync

  def zeros() -> Any:
    return tf.zeros(spec.shape, spec.dtype)

  if replicas == 1:
    return tf.cond(condition, value_fn, zeros)
  launcher = _collective_launcher(replica_context)
  if launcher is not None and not tf.executing_eagerly():
    _follow_merge_call(replica_context)
    instance_key = launcher._next_instance_key()  # pylint: disable=protected-access

    def summed() -> Any:
      with ops.device(launcher._device):  # pylint: disable=protected-access
        return collective_ops.all_reduce_v2(
          value_fn(),
          launcher._group_size,  # pylint: disable=protected-access
          launcher._group_key,  # pylint: disable=protected-access
          instance_key,
          ordering_token=launcher._get_ordering_token(),  # pylint: disable=protected-access
        )

    return tf.cond(condition, summed, zeros)
  if _is_tpu(strategy):
    return tf.cond(
      condition,
      lambda: tf.raw_ops.CrossReplicaSum(
        input=value_fn(), group_assignment=[list(range(replicas))]
      ),
      zeros,
    )
  return replica_context.all_reduce(
    tf.distribute.ReduceOp.SUM, tf.cond(condition, value_fn, zeros)
  )


@contextlib.contextmanager
def worker_local_initial_values(strategy: Any) -> Iterator[None]:
  """Variables created inside start from each worker's own initial value.

  `MultiWorkerMirroredStrategy` broadcasts the chief's initial value of
  every variable to the other workers, so that mirrored copies start
  equal. A row-sharded table's shards are no copies of one value: each
  worker makes its own (zeros, then its rows), and the broadcast would only
  move every shard's bytes between the workers, with a transient copy on
  both sides. Elsewhere this changes nothing.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    yield
    return
  extended = strategy.extended
  # MirroredStrategy's own: the first replica's value, copied to the others.
  extended._get_variable_creator_initial_value = functools.partial(  # pylint: disable=protected-access
    mirrored_strategy.MirroredExtended._get_variable_creator_initial_value,  # pylint: disable=protected-access
    extended,
  )
  try:
    yield
  finally:
    del extended._get_variable_creator_initial_value  # pylint: disable=protected-access


def tape_may_record() -> bool:
  """Whether a `tf.GradientTape` (or a function's tape) may record now."""
  return bool(record.could_possibly_record())


def mark_variable_read(variable: Any) -> None:
  """Tells the tapes that `variable` was read, as reading it would.

  The fused kernels read the table through its handle, which no tape sees;
  this lets a tape watching trainable variables still take the table.
  """
  tape_lib.variable_accessed(variable)


def variable_shape(handle: Any) -> Any:
  """The shape of the resource variable behind `handle` (static if known)."""
  return resource_variable_ops.variable_shape(handle)


# -- tf.tpu.experimental.embedding: optimizers and the mid-level API ------


def slot_names(optimizer: Any) -> list[str]:
  """The slot names of a TPU embedding optimizer, e.g. `["accumulators"]`."""
  return list(optimizer._slot_names())  # pylint: disable=protected-access


def slot_initializers(optimizer: Any) -> list[Any]:
  """The initializer of each of `slot_names(optimizer)`, in that order."""
  return list(optimizer._slot_initializers())  # pylint: disable=protected-access


def create_slots(
  optimizer: Any, table: Any, create: Callable[[str, Any], Any]
) -> dict[str, Any]:
  """`{slot name: variable}` for `table`, each made by `create(name, init)`
  (TF's own slot creation, so names and initial values are TF's)."""
  return optimizer._create_slots(table, create)  # pylint: disable=protected-access


def mid_level_variables(mid: Any) -> dict[str, dict[str, Any]]:
  """A TF `TPUEmbedding*`'s `{table name: {"parameters" | slot: variable}}`."""
  return mid._variables  # pylint: disable=protected-access


def mid_level_on_tpu(mid: Any) -> bool:
  """Whether a TF `TPUEmbedding` keeps its tables in the embedding engine
  (its variables are then CPU copies refreshed around checkpoints)."""
  return bool(getattr(mid, "_using_tpu", False))


def retrieve_from_tpu(mid: Any) -> None:
  """Copies a TF `TPUEmbedding`'s tables from the engine to its variables."""
  mid._retrieve_variables()  # pylint: disable=protected-access


def load_onto_tpu(mid: Any) -> None:
  """Copies a TF `TPUEmbedding`'s variables into the engine."""
  mid._load_variables()  # pylint: disable=protected-access


__all__ = [
  "regroup",
  "select_replica",
  "all_to_all",
  "summed_when",
  "worker_local_initial_values",
  "SPARSECORE_LAYOUTS_CHECKPOINT_KEY",
  "AutoTrackable",
  "CheckpointInitialValueCallable",
  "NoDependency",
  "SaveType",
  "ShardInfo",
  "ShardedVariable",
  "SparseCoreTableLayouts",
  "Trackable",
  "TrackableObjectGraph",
  "VARIABLE_VALUE_KEY",
  "breadth_first_objects",
  "create_slots",
  "deferred_restores",
  "flatten_up_to",
  "flatten_with_joined_string_paths",
  "in_xla_context",
  "load_onto_tpu",
  "lookup_dependency",
  "mark_variable_read",
  "mid_level_on_tpu",
  "mid_level_variables",
  "register_checkpoint_saver",
  "retrieve_from_tpu",
  "slot_initializers",
  "slot_names",
  "tape_may_record",
  "trackable_children",
  "track_child",
  "variable_adder",
  "variable_shape",
]


def checkpoint_key(path: Any, attribute: str) -> str:
  """The key TF saves `attribute` of the object at `path` under.

  `path` as `breadth_first_objects` gives it; e.g. "embedding/items/
  .ATTRIBUTES/VARIABLE_VALUE" for a table tracked as "items" under the
  root's "embedding".
  """
  return trackable_utils.checkpoint_key(
    trackable_utils.object_path_to_string(path), attribute
  )
