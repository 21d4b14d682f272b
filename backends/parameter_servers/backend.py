"""The parameter_servers backend: tables split over parameter servers.

Under `tf.distribute.experimental.ParameterServerStrategy` every table lives
in row ranges on the parameter servers, with each optimizer slot shard next
to the table shard it belongs to (`backends.parameter_servers.storage`).
Per step and table, on the worker that runs it, the lookup is the dynamic
engine's (`backends.tensorcore.engines.dynamic`: one de-duplication per table,
the combiners, weights, sequence features, TF ops): only the gather of the
unique rows goes to the shards that own them, and each unique row's gradient
(summed over the worker's batch) goes to its shard's parameter server, which
applies the table's TPU-semantics optimizer to its table and slot shards in
place. No static-shape engine (no compiled steps on parameter-server
workers) and no fused kernels (the rows are remote).

Workers train asynchronously, as `ParameterServerStrategy` does: each step is
one worker's batch, one replica per worker, no all-reduce; a step's update
lands on the parameter servers while other workers' steps read them. A single
worker running the steps one after another computes exactly what one process
computes.

Checkpoints have the layout of every other backend (`<table>` and
`<table>/<slot>`, full `[vocab, dim]` tensors: a `ShardedVariable` saves its
shards as slices of one full tensor), so a parameter-server checkpoint restores
into `tensorcore` or `serving` on one machine and the other way round.

Example:
  >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
  ...     resolver, variable_partitioner=TablePartitioner(num_shards=2))
  >>> emb = backends.create(config, Adagrad(0.1), strategy,
  backend="parameter_servers")
  >>> with strategy.scope():
  ...   emb.build()
  >>> # in a function scheduled with ClusterCoordinator.schedule:
  >>> #   acts = emb.lookup(ids, training=True); ...
  >>> #   emb.apply_gradients(tape.gradient(loss, acts))
"""

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from backends import base, hardware, layout, table_plan
from backends.parameter_servers.storage import (  # noqa: F401  (public names)
  ParameterServers,
  TablePartitioner,
  shard_offsets,
  shards_of,
)
from backends.storage.base import TableStorage
from backends.tensorcore import composed


class ParameterServerEmbedding(composed.ComposedEmbedding):
  """Tables split over the parameter servers of a ParameterServerStrategy.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: a `ParameterServerStrategy` (default: the one in scope), built
      with a `variable_partitioner` that splits the tables, e.g.
      `TablePartitioner(num_ps)` (`recsys.run.strategy` does this),
      `MinSizePartitioner` or `FixedShardsPartitioner`. Without one every
      table lives whole on one parameter server (a warning says so).
    bag_widths: see `EmbeddingBackend`; `preprocess` pads sparse and ragged
      bags to these widths on the host.
    invalid_ids: "error" (default), "drop" or "oov" for ids outside
      `[0, vocabulary_size)` (see `backends.inputs.validate`).
    layouts: table name -> `TableLayout` (as `recsys.planning` plans
      them): only a layout's `vocabulary` is read — a dynamic table's
      index lives on the first parameter server (its shards, with
      `DynamicVocabulary.shards`, on the servers in turn), shared by every
      worker, and each step maps its batch there alone
      (`VocabularyStage`'s critical section), then resets the rows it gave
      away on the servers that own them.

  Workers are asynchronous: one replica per worker, each step's update is
  applied on the parameter servers without waiting for other workers.
  """

  name = "parameter_servers"
  capabilities = base.Capabilities(
    sharded_tables=True, dynamic_vocabularies=True
  )
  options = frozenset({"bag_widths", "invalid_ids"})
  # Workers share the parameter servers' variables: no per-replica counters.
  _counts_inputs = False

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
    invalid_ids: str = "error",
    layouts: layout.TableLayout
    | Mapping[str, layout.TableLayout]
    | None = None,
  ):
    super().__init__(
      feature_config,
      optimizer,
      strategy,
      bag_widths=bag_widths,
      invalid_ids=invalid_ids,
      fused_kernels=False,
      static_shapes=False,
    )
    self._dynamic = layout.vocabularies(
      [self.table_name(t) for t in self._tables], layouts
    )
    self._take_vocabularies(self._dynamic)

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

  @classmethod
  def plan_tables(
    cls, request: table_plan.PlanRequest
  ) -> table_plan.BackendPlan:
    """Small tables whole on one parameter server, big ones split over them
    (`table_plan.REPLICATE_SHARE` of a device's budget; the partitioner is
    a software choice, made per table). The tables live on the parameter
    servers, not in the workers' memory."""
    servers = request.num_shards
    if servers is None:
      servers = max(1, hardware.num_tasks(request.strategy, "ps"))
    return table_plan.BackendPlan(
      table_plan.small_whole_big_split(
        request, int(servers), cls.name, layout.Placement.PARAMETER_SERVERS
      ),
      tables_in_process=False,
      advice=(
        "shard the tables over more parameter servers (each holds its "
        "share of every split table)"
      ),
    )

  def layouts(self) -> dict[str, layout.TableLayout]:
    """Every table on the parameter servers (whole on one, or split by the
    strategy's partitioner), float32."""
    return {
      self.table_name(t): layout.TableLayout(
        layout.Placement.PARAMETER_SERVERS,
        t.dtype.name,
        vocabulary=self._dynamic.get(self.table_name(t)),
      )
      for t in self._tables
    }

  def _vocabularies(self) -> dict[str, Any]:
    return dict(self._dynamic)

  def _vocabulary_home(self) -> dict[str, Any]:
    # One index per table for every worker: a whole one on the first
    # server's CPU, a sharded one's shards on the servers in turn.
    servers = max(1, hardware.num_tasks(self._strategy, "ps"))
    return {
      "devices": [
        f"/job:ps/replica:0/task:{task}/device:CPU:0" for task in range(servers)
      ],
      "concurrent": True,
    }

  def _make_storage(self, table: Any) -> TableStorage:
    return ParameterServers(
      table, self.table_name(table), self.optimizer_for(table), self._strategy
    )

  # `embedding_tables` / `slot_variables` hold `ShardedVariable`s.

  def shard_devices(self) -> dict[str, list[str]]:
    """The parameter-server device of each shard, per table name."""
    self._maybe_build()
    return {
      name: storage.devices()  # type: ignore[attr-defined]
      for name, storage in self._storages.items()
    }
