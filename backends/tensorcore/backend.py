"""The TensorCore backend: tables on the compute devices, placed per table.

This is the design of TF's `TPUEmbeddingV0` (the path for TPUs without an
embedding accelerator), implemented so that it runs under any strategy —
default, `MirroredStrategy`, `MultiWorkerMirroredStrategy`, `TPUStrategy` —
and improved where V0 falls short:

* Tables too big for one device are row-sharded over the replicas (each
  table's `TableLayout`, `layouts=`; `backends.layout`): each replica
  holds a slice of the rows and their slots, a step exchanges ids, rows
  and gradients through the replicas' collectives with static shapes, and
  each owner alone applies the optimizer to its rows
  (`backends.storage.row_sharded`). Other tables stay replicated
  (`backends.storage.replicated`); `plan_tables` chooses per table for the
  planner (`recsys.planning`).
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
* On CPU hosts a training step runs fused C++ kernels
  (`backends.tensorcore.kernels`) instead of a chain of generic TF ops; same
  math.
* Compiled steps (a TPU, `jit_compile=True`) take a static-shape engine
  (`backends.tensorcore.engines.static`): fixed-capacity de-duplication, padding
  slots that never touch a row, a fixed-size exchange; same math again.

The machinery is `backends.tensorcore.composed` (a storage per table x an engine
per step). It keeps V0's public API (`embedding_lookup`, `__call__`,
`embedding_tables`, slots through `slot_variable_creation_fn`, building on
first use), so V0's own training-loop example (a tape on `embedding_tables`
and a Keras optimizer, in a `tf.range` loop) runs as written on replicated
tables, with several mirrored replicas and compiled.

Example:
  >>> table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="items")
  >>> config = {"item": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> opt = tf.tpu.experimental.embedding.Adagrad(0.1)
  >>> emb = TensorCoreEmbedding(config, opt)      # layouts={"items": ...}
  >>> with tf.GradientTape() as tape:
  ...   acts = emb({"item": tf.constant([3, 5])}, training=True)
  ...   loss = tf.reduce_sum(acts["item"])
  >>> emb.apply_gradients(tape.gradient(loss, acts))
"""

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from backends import base, hardware, table_plan
from backends import placement as placement_lib
from backends.layout import (
  Exchange,
  Placement,
  TableLayout,
  every_table,
  value_of,
)
from backends.storage import narrow, row_sharded
from backends.storage import replicated as replicated_lib
from backends.storage.base import TableStorage
from backends.tensorcore import composed


class TensorCoreEmbedding(composed.ComposedEmbedding):
  """Tables replicated or row-sharded over the replicas, TPU optimizer math.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without one.
    strategy: defaults to the strategy in scope.
    bag_widths, invalid_ids, fused_kernels, static_shapes: see
      `backends.tensorcore.composed.ComposedEmbedding`.
    layouts: each table's `backends.layout.TableLayout`: one for every
      table, or table name -> layout (other tables replicated float32).
      None: every table replicated float32. `recsys.planning` makes them
      from `EmbeddingPlacement` and the tables' sizes. A layout says
      where the rows live ("replicated": a full copy per replica;
      "row_sharded": each replica owns `1/R` of the rows and their slots),
      which rows a replica owns ("contiguous": equal row ranges,
      initialized, checkpointed and restored by row slices where they
      live; "strided": ids `r, r + R, ...`, saved whole), how the replicas
      exchange a row-sharded table's ids, rows and gradients
      ("all_to_all": each id to its owner only; "all_gather": never
      overflows; `backends.storage.exchange`) with the all-to-all's margin
      `exchange_sigmas`, and the dtype its rows are stored in ("float32",
      "bfloat16" or "float16": half the bytes; slots stay float32;
      `backends.storage.narrow`: the model sees float32 rows, a value beyond the
      range saturates, float16: +-65504, counted in `narrow_counts`).
    rounding_seed: the seed of the stochastic rounding of narrow tables'
      updates: the same seed and steps give bit-identical tables.
    saturate_restores: a restore into a narrow table of a checkpoint that
      holds values beyond its dtype's range (a float32 checkpoint into a
      float16 table: beyond +-65504) saturates them to its largest finite
      value, with a warning; False (default): such a restore is refused
      before anything is restored (`backends.storage.narrow.NarrowRangeError`).
    restore_only: the tables alone, no optimizer slots, for a run restored
      to be evaluated (`recsys evaluate`): a checkpoint's slots are left
      unread; it cannot train.
  """

  name = "tensorcore"
  capabilities = base.Capabilities(layouts=True, dynamic_vocabularies=True)
  options = frozenset(
    {
      "bag_widths",
      "invalid_ids",
      "fused_kernels",
      "static_shapes",
      "rounding_seed",
      "saturate_restores",
      "restore_only",
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
    layouts: TableLayout | Mapping[str, TableLayout] | None = None,
    rounding_seed: int = 0,
    saturate_restores: bool = False,
    restore_only: bool = False,
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
    names = [self.table_name(t) for t in self._tables]
    self._table_layouts = every_table(names, layouts or {})
    for table in self._tables:
      name = self.table_name(table)
      held = self._table_layouts[name]
      # Its storages hold tables replicated or row-sharded, nothing else.
      value_of(
        held.placement,
        Placement,
        f"layouts[{name!r}].placement",
        Placement.requestable(),
      )
      if held.dtype not in narrow.STORAGE_DTYPES:
        raise ValueError(
          f"layouts[{name!r}].dtype = {held.dtype!r}; use one of "
          f"{', '.join(narrow.STORAGE_DTYPES)} (table_dtype)."
        )
      if held.row_sharded:
        row_sharded.check_optimizer(name, self.optimizer_for(table))
    self._take_vocabularies(self._vocabularies())
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
    self._restore_only = base.checked_restore_only(restore_only)

  @classmethod
  def plan_tables(
    cls, request: table_plan.PlanRequest
  ) -> table_plan.BackendPlan:
    """Each table replicated or row-sharded over the replicas
    (`backends.placement.place_tables`): replicated while the tables fit a
    device's budget, the largest row-sharded when they do not, a table
    refused when even that does not fit; forced placements kept. Each
    table's layout takes the requested row layout, exchange margin and
    dtype."""
    replicas = request.replicas
    plan = placement_lib.place_tables(
      request.tables,
      replicas,
      request.budget_bytes,
      {name: str(where.value) for name, where in request.forced.items()},
      request.forced_by,
      _exchange_request(request.exchange),
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
          layout=TableLayout(
            Placement(placed.placement),
            request.dtype(placed.table),
            request.row_layout,
            Exchange(placed.exchange) if placed.exchange else None,
            request.exchange_sigmas,
          ),
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

  @property
  def lookup_only(self) -> bool:
    return self._restore_only

  def _make_storage(self, table: Any) -> TableStorage:
    name = self.table_name(table)
    held = self._table_layouts[name]
    # Restored to be evaluated or exported: the tables alone, no slots.
    optimizer = None if self._restore_only else self.optimizer_for(table)
    args = (table, name, optimizer, self._strategy)
    if held.row_sharded:
      return row_sharded.RowSharded(
        *args,
        layout=str(held.row_layout),
        exchange=str(held.exchange),
        exchange_sigmas=float(held.exchange_sigmas or 0),
        dtype=str(held.dtype),
        rounding_seed=narrow.table_seed(self._rounding_seed, name),
      )
    return replicated_lib.Replicated(
      *args,
      dtype=str(held.dtype),
      rounding_seed=narrow.table_seed(self._rounding_seed, name),
      saturate_restores=self.saturate_restores,
    )

  def input_options(self) -> tf.distribute.InputOptions:
    """On a TPU with dynamic tables, batches stay on the host: each is
    mapped there before the replica step, which takes the rows as its
    inputs (raw ids would cross to the device and back otherwise)."""
    on_tpu = hardware.embedding_feature(self._strategy) is not None
    if self._vocabularies() and on_tpu:
      return tf.distribute.InputOptions(experimental_fetch_to_device=False)
    return super().input_options()

  def layouts(self) -> dict[str, TableLayout]:
    """Table name -> its layout, as built (or to be built)."""
    return dict(self._table_layouts)

  def _vocabularies(self) -> dict[str, Any]:
    return {
      name: held.vocabulary
      for name, held in self._table_layouts.items()
      if held.dynamic
    }


def _exchange_request(exchange: Any) -> Any:
  """The request's exchange as `placement.place_tables` reads it: strings."""
  if isinstance(exchange, Mapping):
    return {name: str(value) for name, value in exchange.items()}
  return str(exchange)
