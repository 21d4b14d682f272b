"""The sharded backend: tables row-sharded over parameter servers.

Under `tf.distribute.experimental.ParameterServerStrategy`, a variable created
in `strategy.scope()` becomes a `ShardedVariable` when the strategy's
`variable_partitioner` splits it: contiguous row ranges ("div" partitioning,
the first `V % N` shards one row longer) on different parameter servers. This
backend builds each table that way, and each optimizer slot shard by shard
next to the table shard it belongs to (same rows, same parameter server), so
a row's weights and slots always live together.

Per step and table, on the worker that runs it:

* lookup: the ids of every feature of the table are de-duplicated, routed to
  the shards that own them (local row = id - shard offset), gathered on each
  parameter server (only the touched rows cross the network) and combined per
  feature with the conventions of every backend (`backends.inputs` flat bags,
  `sum` / `mean` / `sqrtn`, weights, sequence features);
* update: each unique row's gradient (summed over the worker's batch) is sent
  to its shard's parameter server, which applies the table's TPU-semantics
  optimizer (`backends.optimizers.apply_sparse_update`) to its table and slot
  shards in place.

Workers train asynchronously, as `ParameterServerStrategy` does: each step is
one worker's batch, one replica per worker, no all-reduce; a step's update
lands on the parameter servers while other workers' steps read them. A single
worker running the steps one after another computes exactly what one process
computes.

Checkpoints have the layout of every other backend (`<table>` and
`<table>/<slot>`, full `[vocab, dim]` tensors: a `ShardedVariable` saves its
shards as slices of one full tensor), so a sharded checkpoint restores into
`tensorcore` or `serving` on one machine and the other way round.

Example:
  >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
  ...     resolver, variable_partitioner=TablePartitioner(num_shards=2))
  >>> emb = backends.create(config, Adagrad(0.1), strategy, backend="sharded")
  >>> with strategy.scope():
  ...   emb.build()
  >>> # in a function scheduled with ClusterCoordinator.schedule:
  >>> #   acts = emb.lookup(ids, training=True); ...
  >>> #   emb.apply_gradients(tape.gradient(loss, acts))
"""

import contextlib
import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable_base  # pylint: disable=g-direct-tensorflow-import

from backends import base, hardware, optimizers, tensorcore

embedding = tf.tpu.experimental.embedding
log = logging.getLogger("recsys.backends")

_BUILDING = threading.local()


@contextlib.contextmanager
def _building_tables():
  """Marks variable creation as "an embedding table" for `TablePartitioner`."""
  previous = getattr(_BUILDING, "active", False)
  _BUILDING.active = True
  try:
    yield
  finally:
    _BUILDING.active = previous


class TablePartitioner:
  """A `variable_partitioner` that shards embedding tables and nothing else.

  `ParameterServerStrategy` calls its `variable_partitioner` for every
  variable created in its scope. This one splits the tables that the sharded
  backend builds into `num_shards` row ranges (fewer if a shard would hold
  less than `min_shard_bytes`, never more than the table's rows) and leaves
  every other variable (the dense model, the optimizers, metrics) whole, so
  Keras layers never see a `ShardedVariable`.

  Args:
    num_shards: the most shards per table, usually the number of parameter
      servers.
    min_shard_bytes: a table shard holds at least this many bytes (0: always
      `num_shards` shards).

  Example:
    >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
    ...     resolver, variable_partitioner=TablePartitioner(2))
  """

  def __init__(self, num_shards: int, min_shard_bytes: int = 0):
    if int(num_shards) < 1:
      raise ValueError(
        f"TablePartitioner(num_shards={num_shards!r}): need >= 1."
      )
    self.num_shards = int(num_shards)
    self.min_shard_bytes = int(min_shard_bytes)

  def __call__(
    self, shape: tf.TensorShape, dtype: tf.dtypes.DType, axis: int = 0
  ) -> list[int]:
    partitions = [1] * len(shape)
    if not getattr(_BUILDING, "active", False) or not len(shape):
      return partitions
    shards = self.num_shards
    if self.min_shard_bytes > 0:
      total = shape.num_elements() * tf.as_dtype(dtype).size
      shards = max(1, min(shards, total // self.min_shard_bytes))
    partitions[axis] = max(1, min(shards, int(shape[axis])))
    return partitions

  def __repr__(self) -> str:
    return (
      f"TablePartitioner(num_shards={self.num_shards}, "
      f"min_shard_bytes={self.min_shard_bytes})"
    )


def shards_of(variable: tf.Variable) -> list[tf.Variable]:
  """The shard variables of a table (one, if it is not sharded)."""
  if isinstance(variable, sharded_variable.ShardedVariable):
    return list(variable.variables)
  return [variable]


def shard_offsets(variable: tf.Variable) -> list[int]:
  """First row of each shard, then the row count: `[0, n0, n0 + n1, ..., V]`."""
  offsets = [0]
  for shard in shards_of(variable):
    offsets.append(offsets[-1] + int(shard.shape[0]))
  return offsets


class ShardedEmbedding(tensorcore.TensorCoreEmbedding):
  """Tables row-sharded over the parameter servers of a ParameterServerStrategy.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: a `ParameterServerStrategy` (default: the one in scope), built
      with a `variable_partitioner` that splits the tables, e.g.
      `TablePartitioner(num_ps)` (`recsys.training.strategy` does this),
      `MinSizePartitioner` or `FixedShardsPartitioner`. Without one every
      table lives whole on one parameter server (a warning says so).
    bag_widths: see `EmbeddingBackend`; `preprocess` pads sparse and ragged
      bags to these widths on the host.
    invalid_ids: "error" (default), "drop" or "oov" for ids outside
      `[0, vocabulary_size)` (see `backends.inputs.validate`).

  Workers are asynchronous: one replica per worker, each step's update is
  applied on the parameter servers without waiting for other workers.
  """

  name = "sharded"
  capabilities = base.Capabilities(sharded_tables=True)

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> str | None:
    if not hardware.is_parameter_server(strategy):
      return (
        f"it needs a ParameterServerStrategy (the tables live on its "
        f"parameter servers); this is {type(strategy).__name__}. Start a "
        "cluster (TF_CONFIG with a 'ps' job, e.g. `recsys launch --ps 2 "
        "--workers 2 -- ...`) or use 'tensorcore'"
      )
    replicas = strategy.num_replicas_in_sync
    if replicas > 1:
      return (
        f"it runs one replica per worker (asynchronous CPU workers); "
        f"this ParameterServerStrategy has {replicas} GPUs per worker. "
        "Hide the GPUs (CUDA_VISIBLE_DEVICES=) or use "
        "MultiWorkerMirroredStrategy with 'tensorcore'"
      )
    return None

  # -- variables ---------------------------------------------------------------

  @base.cross_replica_build
  def build(self) -> None:
    """Creates the sharded tables and slots on the parameter servers."""
    if self._built:
      return
    with tf.init_scope(), self._strategy.scope():
      self._create_variables()
    self._built = True
    for name, table_vars in self._variables.items():
      params = table_vars["parameters"]
      shards = shards_of(params)
      log.info(
        "table %r %s: %d shard(s) of rows %s on %s",
        name,
        params.shape.as_list(),
        len(shards),
        shard_offsets(params),
        ", ".join(s.device for s in shards),
      )
      num_ps = _num_parameter_servers(self._strategy)
      if len(shards) == 1 and num_ps > 1:
        log.warning(
          "table %r is not sharded: it lives whole on %s. Build the "
          "ParameterServerStrategy with variable_partitioner="
          "backends.sharded.TablePartitioner(%d) to split tables over the "
          "%d parameter servers.",
          name,
          shards[0].device,
          num_ps,
          num_ps,
        )

  def _create_table_variables(self, table) -> dict[str, tf.Variable]:
    name = self.table_name(table)
    shape = (table.vocabulary_size, table.dim)

    def table_getter(name, shape, dtype, initializer, trainable):
      del shape
      with _building_tables():
        return tf.Variable(
          initial_value=_partition_aware(
            initializer, (table.vocabulary_size, table.dim), dtype
          ),
          name=name,
          shape=(table.vocabulary_size, table.dim),
          dtype=dtype,
          trainable=trainable,
        )

    params = self._add_variable_with_custom_getter(
      name=name,
      initializer=table.initializer,
      shape=shape,
      dtype=tf.float32,
      getter=table_getter,
      trainable=True,
    )
    out = {"parameters": params}
    opt = self.optimizer_for(table)
    for slot, init in optimizers.slot_initializers(opt).items():

      def slot_getter(name, shape, dtype, initializer, trainable):
        del shape
        return self._colocated_like(params, name, initializer, dtype, trainable)

      out[slot] = self._add_variable_with_custom_getter(
        name=f"{name}/{slot}",
        initializer=init,
        shape=shape,
        dtype=tf.float32,
        getter=slot_getter,
        trainable=False,
      )
    return out

  def _colocated_like(self, params, name, initializer, dtype, trainable):
    """A variable partitioned like `params`, each shard next to its shard."""
    parts = []
    offsets = shard_offsets(params)
    full = params.shape.as_list()
    for i, shard in enumerate(shards_of(params)):
      rows = offsets[i + 1] - offsets[i]
      init = _shard_value(initializer, full, rows, offsets[i], dtype)
      with self._strategy.extended.colocate_vars_with(shard):
        parts.append(
          tf.Variable(
            initial_value=init,
            shape=(rows,) + tuple(full[1:]),
            dtype=dtype,
            name=(f"{name}/part_{i}" if len(offsets) > 2 else name),
            trainable=trainable,
          )
        )
    if len(parts) == 1:
      return parts[0]
    return sharded_variable.ShardedVariable(parts, name=name)

  # `embedding_tables` / `slot_variables` (inherited) hold `ShardedVariable`s.

  def shard_devices(self) -> dict[str, list[str]]:
    """The parameter-server device of each shard, per table name."""
    self._maybe_build()
    return {
      name: [s.device for s in shards_of(v["parameters"])]
      for name, v in self._variables.items()
    }

  def input_stats(self) -> dict[str, dict[str, int]]:
    """Not kept: the sharded backend counts no dropped or truncated ids."""
    return {}

  # -- where the rows live ----------------------------------------------------
  #
  # Lookups and row gradients are `TensorCoreEmbedding`'s (`backends._bags`:
  # one de-duplication per table, the combiners, weights, sequence features);
  # only the gather of the unique rows and the update go to the shards. No
  # static-shape path (no compiled steps on parameter-server workers) and no
  # fused kernels (the rows are remote).

  def _static_path(self, training: bool) -> bool:
    del training
    return False

  def _gather_rows(self, params: tf.Variable, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of a (sharded) table, each shard gathered where it lives."""
    return _gather_rows(params, ids)

  def _apply_updates(
    self, groups: Mapping[int, tuple[Any, list[optimizers.SparseUpdate]]]
  ) -> None:
    """Each table's update on the parameter servers owning its rows.

    Each unique row's gradient is summed over this worker's batch (no
    all-reduce: workers are asynchronous) and sent to its shard.
    """
    for opt, updates in groups.values():
      for u in updates:
        _apply_on_shards(opt, u.table, u.slots, u.ids, u.grads)


# -- helpers -----------------------------------------------------------------


def num_tasks(strategy: tf.distribute.Strategy, job: str) -> int:
  """Tasks of `job` ("ps", "worker") in the cluster `strategy` runs on.

  `ParameterServerStrategy` has no public `cluster_resolver`; it connects
  this process to its cluster, whose remote devices are listed by
  `tf.config.list_logical_devices()`.
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is not None:
    try:
      return resolver.cluster_spec().num_tasks(job)
    except (ValueError, KeyError):
      return 0
  tasks = set()
  for device in tf.config.list_logical_devices():
    spec = tf.DeviceSpec.from_string(device.name)
    if spec.job == job:
      tasks.add(spec.task)
  return len(tasks)


def _num_parameter_servers(strategy) -> int:
  return max(1, num_tasks(strategy, "ps"))


def _partition_aware(initializer, full_shape, dtype):
  """An `initial_value` the strategy can call per partition (or whole)."""
  if isinstance(initializer, trackable_base.CheckpointInitialValueCallable):
    # Restore on create: the strategy passes each shard's `shard_info`, the
    # callable reads that slice of the full tensor.
    return functools.partial(initializer, shape=tuple(full_shape), dtype=dtype)

  def initial_value(partition_shape=None, partition_offset=None):
    init = initializer
    if partition_offset is not None and partition_offset[0]:
      init = _reseeded_for_rows(initializer, int(partition_offset[0]))
    return init(tuple(partition_shape or full_shape), dtype=dtype)

  return initial_value


def _reseeded_for_rows(initializer, first_row: int):
  """A seeded Keras initializer's copy for the shard starting at `first_row`.

  A seeded initializer returns the same values for the same shape: without
  this, shards of equal size would start identical.
  """
  get_config = getattr(initializer, "get_config", None)
  config = get_config() if callable(get_config) else {}
  if config.get("seed") is None:
    return initializer
  seed = (int(config["seed"]) + 1_000_003 * first_row) % (1 << 31)
  return type(initializer).from_config({**config, "seed": seed})


def _shard_value(initializer, full_shape, rows, offset, dtype):
  """The initial value of one shard: its checkpoint slice or a fresh value."""
  shape = (rows,) + tuple(full_shape[1:])
  if isinstance(initializer, trackable_base.CheckpointInitialValueCallable):
    info = trackable_base.ShardInfo(
      shape=tf.TensorShape(shape), offset=(offset,) + (0,) * (len(shape) - 1)
    )
    return lambda: initializer(shape=tuple(full_shape), shard_info=info)
  return lambda: initializer(shape, dtype=dtype)


def _route(variable, ids: tf.Tensor):
  """Splits unique ids by owning shard: (shards, local ids, positions)."""
  shards = shards_of(variable)
  offsets = shard_offsets(variable)
  if len(shards) == 1:
    return shards, [ids], None
  bounds = tf.constant(offsets[1:-1], tf.int64)
  owner = tf.cast(tf.searchsorted(bounds, ids, side="right"), tf.int32)
  local = ids - tf.gather(tf.constant(offsets[:-1], tf.int64), owner)
  positions = tf.dynamic_partition(tf.range(tf.size(ids)), owner, len(shards))
  return shards, tf.dynamic_partition(local, owner, len(shards)), positions


def _gather_rows(variable, ids: tf.Tensor) -> tf.Tensor:
  """Rows `ids` of a (sharded) table, each shard gathered where it lives."""
  shards, local_ids, positions = _route(variable, ids)
  parts = []
  for shard, local in zip(shards, local_ids):
    with tf.device(shard.device):
      parts.append(
        tf.raw_ops.ResourceGather(
          resource=shard.handle, indices=local, dtype=shard.dtype
        )
      )
  if positions is None:
    return parts[0]
  return tf.dynamic_stitch(positions, parts)


def _apply_on_shards(
  opt, params, slots: dict[str, tf.Variable], ids: tf.Tensor, grads: tf.Tensor
) -> None:
  """`apply_sparse_update` on each shard with its local rows, on its server."""
  shards, local_ids, positions = _route(params, ids)
  slot_shards = {k: shards_of(v) for k, v in slots.items()}
  for i, (shard, local) in enumerate(zip(shards, local_ids)):
    shard_grads = grads if positions is None else tf.gather(grads, positions[i])
    with tf.device(shard.device):
      optimizers.apply_sparse_update(
        opt,
        shard,
        {k: v[i] for k, v in slot_shards.items()},
        local,
        shard_grads,
      )
