"""The TensorCore backend: tables on the compute devices, placed per table.

This is the design of TF's `TPUEmbeddingV0` (the path for TPUs without an
embedding accelerator), implemented so that it runs under any strategy —
default, `MirroredStrategy`, `MultiWorkerMirroredStrategy`, `TPUStrategy` —
and improved where V0 falls short:

* Tables too big for one device are row-sharded over the replicas
  (`placement`): each replica holds a slice of the rows and their slots, a
  step exchanges ids, rows and gradients through the replicas' collectives
  with static shapes, and each owner alone applies the optimizer to its
  rows (`backends.storage.replica_sharded`). Other tables stay replicated
  (`backends.storage.replicated`); `plan_tables` chooses per table for
  the planner (`recsys.planning`).
* The embedding optimizer is applied here, as sparse row updates with the TPU
  optimizers' math (`backends.optimizers`), after summing each touched row's
  gradient over the global batch.
* Replicas exchange only the rows they touched, never a dense all-reduce of
  whole tables.
* Ids are de-duplicated per table before the gather (features sharing a
  table share one gather).
* Inputs are validated: ids outside `[0, vocabulary_size)` raise an error
  naming the feature, table, id and batch row (or are dropped / mapped to an
  OOV row, and counted).
* `preprocess` pads sparse and ragged bags to a static width on the host.
* On CPU hosts a training step runs fused C++ kernels (`backends.kernels`)
  instead of a chain of generic TF ops; same math.
* Compiled steps (a TPU, `jit_compile=True`) take a static-shape engine
  (`backends.engines.static`): fixed-capacity de-duplication, padding slots
  that never touch a row, a fixed-size exchange; same math again.

The machinery is `backends.composed` (a storage per table x an engine per
step). It keeps V0's public API (`embedding_lookup`, `__call__`,
`embedding_tables`, slots through `slot_variable_creation_fn`, building on
first use), so V0's own training-loop example (a tape on `embedding_tables`
and a Keras optimizer, in a `tf.range` loop) runs as written on replicated
tables, with several mirrored replicas and compiled.

Example:
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="items")
  >>> config = {"item": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> opt = tf.tpu.experimental.embedding.Adagrad(0.1)
  >>> emb = TensorCoreEmbedding(config, opt)      # placement={"items": ...}
  >>> with tf.GradientTape() as tape:
  ...   acts = emb({"item": tf.constant([3, 5])}, training=True)
  ...   loss = tf.reduce_sum(acts["item"])
  >>> emb.apply_gradients(tape.gradient(loss, acts))
"""

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from backends import base, composed, narrow, table_plan
from backends import placement as placement_lib
from backends.storage import PLACEMENTS, TableStorage, replica_sharded
from backends.storage import exchange as exchange_lib
from backends.storage import replicated as replicated_lib
from backends.storage import row_layout as row_layout_lib


class TensorCoreEmbedding(composed.ComposedEmbedding):
  """Tables replicated or row-sharded over the replicas, TPU optimizer math.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the strategy in scope.
    bag_widths, invalid_ids, fused_kernels, static_shapes: see
      `backends.composed.ComposedEmbedding`.
    placement: where each table's rows live: "replicated" (a full copy per
      replica) or "row_sharded" (each replica owns `1/R` of the rows and
      their slots); one value for every table, or table name -> value (other
      tables replicated). None: every table replicated. `recsys.planning`
      chooses from the tables' sizes and a device's memory.
    row_layout: which rows a replica owns when row-sharded: "contiguous"
      (equal row ranges; default: initialized, checkpointed and restored
      by row slices where they live) or "strided" (ids `r, r + R, ...`:
      frequent ids spread evenly over replicas when a vocabulary numbers
      them first; saved whole).
    exchange: how the replicas exchange a row-sharded table's ids, rows and
      gradients: "all_to_all" (each id to its owner only: a replica's
      traffic does not grow with the replicas; default) or "all_gather"
      (never overflows); one value for every table or table name -> value
      (`backends.storage.exchange`; `recsys.planning` chooses per table).
    exchange_sigmas: the all-to-all's margin per owner over the even share
      of a step's ids, in standard deviations of a uniform spread.
    table_dtype: the dtype a table's rows are stored in: "float32"
      (default), "bfloat16" or "float16" (half the bytes; slots stay
      float32; `backends.narrow`); one value for every table, or table
      name -> dtype (others float32). A narrow table is replicated or
      row-sharded, the model sees float32 rows; a value beyond its range
      saturates (float16: +-65504), counted (`narrow_counts`).
    rounding_seed: the seed of the stochastic rounding of narrow tables'
      updates: the same seed and steps give bit-identical tables.
    saturate_restores: a restore into a narrow table of a checkpoint that
      holds values beyond its dtype's range (a float32 checkpoint into a
      float16 table: beyond +-65504) saturates them to its largest finite
      value, with a warning; False (default): such a restore is refused
      before anything is restored (`backends.narrow.NarrowRangeError`).
  """

  name = "tensorcore"
  capabilities = base.Capabilities()
  options = frozenset(
    {
      "bag_widths",
      "invalid_ids",
      "fused_kernels",
      "static_shapes",
      "placement",
      "row_layout",
      "exchange",
      "exchange_sigmas",
      "table_dtype",
      "rounding_seed",
      "saturate_restores",
    }
  )

  def __init__(
    self,
    feature_config: Any,
    optimizer: Any | None = None,
    strategy: tf.distribute.Strategy | None = None,
    *,
    bag_widths: None | int | Mapping[str, int] = None,
    invalid_ids: str = "error",
    fused_kernels: bool = True,
    static_shapes: bool | None = None,
    placement: None | str | Mapping[str, str] = None,
    row_layout: str = replica_sharded.DEFAULT_ROW_LAYOUT,
    exchange: str | Mapping[str, str] = exchange_lib.ALL_TO_ALL,
    exchange_sigmas: float = exchange_lib.CAPACITY_SIGMAS,
    table_dtype: str | Mapping[str, str] = "float32",
    rounding_seed: int = 0,
    saturate_restores: bool = False,
  ):
    super().__init__(
      feature_config,
      optimizer,
      strategy,
      bag_widths=bag_widths,
      invalid_ids=invalid_ids,
      fused_kernels=fused_kernels,
      static_shapes=static_shapes,
    )
    self._placement = resolve_placement(
      placement, [self.table_name(t) for t in self._tables]
    )
    self._dtypes = _per_table(
      "table_dtype",
      table_dtype,
      [self.table_name(t) for t in self._tables],
      narrow.STORAGE_DTYPES,
    )
    for table in self._tables:
      name = self.table_name(table)
      if self._placement[name] == "row_sharded":
        replica_sharded.check_optimizer(name, self.optimizer_for(table))
    if not isinstance(rounding_seed, int):
      raise ValueError(
        f"rounding_seed={rounding_seed!r}; use an int (the seed of narrow "
        "tables' stochastic rounding)."
      )
    self._rounding_seed = rounding_seed
    if not isinstance(saturate_restores, bool):
      raise ValueError(
        f"saturate_restores={saturate_restores!r}; use True (a restore "
        "saturates values beyond a narrow table's range) or False (it "
        "refuses them)."
      )
    self.saturate_restores = saturate_restores
    row_layout_lib.make(row_layout, 1, 1)  # refuses an unknown name
    self._row_layout = row_layout
    self._exchange = resolve_exchange(
      exchange, [self.table_name(t) for t in self._tables]
    )
    if not float(exchange_sigmas) > 0:
      raise ValueError(
        f"exchange_sigmas={exchange_sigmas!r}; use a number > 0 (the "
        "all-to-all's margin over each owner's share, in standard "
        f"deviations; default {exchange_lib.CAPACITY_SIGMAS})."
      )
    self._exchange_sigmas = float(exchange_sigmas)

  @classmethod
  def plan_tables(
    cls, request: table_plan.PlanRequest
  ) -> table_plan.BackendPlan:
    """Each table replicated or row-sharded over the replicas
    (`backends.placement.place_tables`): replicated while the tables fit a
    device's budget, the largest row-sharded when they do not, a table
    refused when even that does not fit; forced placements kept."""
    replicas = request.replicas
    plan = placement_lib.place_tables(
      request.tables,
      replicas,
      request.budget_bytes,
      request.forced,
      request.forced_by,
      request.exchange,
      request.exchange_sigmas,
    )
    tables = []
    for placed in plan.placements:
      sharded = placed.placement == placement_lib.ROW_SHARDED
      tables.append(
        table_plan.TablePlan(
          placed.table,
          replicas if sharded else 1,
          placed.bytes_per_device,
          placed.reason,
          row_sharded=sharded,
          exchange_bytes=placed.exchange_bytes,
          exchange=placed.exchange,
        )
      )
    return table_plan.BackendPlan(
      tables,
      plan.refusals,
      advice=(
        f"shard the tables ({cls.name}: row-sharded over several replicas, "
        "EmbeddingPlacement)"
      ),
    )

  def _make_storage(self, table: Any) -> TableStorage:
    name = self.table_name(table)
    args = (table, name, self.optimizer_for(table), self._strategy)
    if self._placement[name] == "row_sharded":
      return replica_sharded.ReplicaSharded(
        *args,
        layout=self._row_layout,
        exchange=self._exchange[name],
        exchange_sigmas=self._exchange_sigmas,
        dtype=self._dtypes[name],
        rounding_seed=narrow.table_seed(self._rounding_seed, name),
      )
    return replicated_lib.Replicated(
      *args,
      dtype=self._dtypes[name],
      rounding_seed=narrow.table_seed(self._rounding_seed, name),
      saturate_restores=self.saturate_restores,
    )

  def table_dtypes(self) -> dict[str, str]:
    """Table name -> the dtype its rows are stored in."""
    return dict(self._dtypes)

  def exchanges(self) -> dict[str, str]:
    """Table name -> its exchange, for the row-sharded tables."""
    return {
      name: self._exchange[name]
      for name, where in self._placement.items()
      if where == "row_sharded"
    }


def resolve_placement(
  placement: None | str | Mapping[str, str], table_names: list[str]
) -> dict[str, str]:
  """Table name -> "replicated" or "row_sharded" from the `placement` option.

  Raises:
    ValueError: an unknown placement or table name (the valid ones listed).
  """
  return _per_table(
    "placement", placement or "replicated", table_names, PLACEMENTS
  )


def resolve_exchange(
  exchange: str | Mapping[str, str], table_names: list[str]
) -> dict[str, str]:
  """Table name -> exchange from the `exchange` option (others all-to-all).

  Raises:
    ValueError: an unknown exchange or table name (the valid ones listed).
  """
  return _per_table("exchange", exchange, table_names, exchange_lib.EXCHANGES)


def _per_table(
  option: str,
  value: str | Mapping[str, str],
  table_names: list[str],
  allowed: tuple[str, ...],
) -> dict[str, str]:
  """Table name -> value of an option given once or per table; a table a
  dict leaves out gets `allowed[0]` (the option's default)."""

  def check(given: Any, where: str) -> str:
    if given not in allowed:
      raise ValueError(f"{where} = {given!r}; use one of {', '.join(allowed)}.")
    return given

  if isinstance(value, str):
    one = check(value, option)
    return {name: one for name in table_names}
  unknown = sorted(set(value) - set(table_names))
  if unknown:
    raise ValueError(
      f"{option} names unknown tables {unknown}; the tables are "
      f"{sorted(table_names)}."
    )
  return {
    name: check(value.get(name, allowed[0]), f"{option}[{name!r}]")
    for name in table_names
  }
