"""The planner's question to a backend, and the backend's answer.

`recsys.planning` asks the run's backend where its tables would live —
`EmbeddingBackend.plan_tables(request)` — and renders the answer; each
backend answers for its own tables, so the planner names no backend. The
question (`PlanRequest`) carries the tables' sizes, the strategy (what
`backends.hardware` reads from it: replicas, parameter servers, TPU cores),
one device's budget and the layouts the settings request; the answer
(`BackendPlan`) gives each table's split, its bytes per device and why, its
`TableLayout` (what the backend is built with and reports), and the
refusals.

The bytes are `backends.placement`'s (`TableSize`); this module holds the
rules several backends share: every table whole on each device, every table
split over the devices, or small tables whole and big ones split.

Example:
  >>> sizes = [placement.TableSize("t", 1000, 8, num_slots=1)]
  >>> request = PlanRequest(sizes, strategy, budget_bytes=1 << 20)
  >>> backends.get(name).plan_tables(request).tables[0].shards
  1
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from backends import placement
from backends.errors import BackendError
from backends.layout import Exchange, Placement, RowLayout, TableLayout
from backends.placement import human_bytes

#: With a backend that splits tables over its devices as it likes, a table
#: (with its slots) stays whole while it takes at most this share of a
#: device's embedding budget: its lookups then need no network or
#: cross-device traffic. Bigger tables are split over the devices.
REPLICATE_SHARE = 0.1


class PlanAnswerError(BackendError, ValueError):
  """A backend's `plan_tables` answered about other tables than it was
  asked about (a bug in that backend)."""


@dataclasses.dataclass(frozen=True)
class PlanRequest:
  """What the planner asks a backend about: tables, hardware, budget.

  Attributes:
    tables: each table's size, in the report's order.
    strategy: the run's strategy (replicas, parameter servers, TPU cores).
    budget_bytes: what one device may hold of tables and slots; None when
      a device's memory is unknown.
    num_shards: the devices a split table goes over when the caller says
      (None: the backend's own count, e.g. its parameter servers).
    forced: table name -> the `Placement` the settings force (only for a
      backend that is built from layouts, `Capabilities.layouts`).
    forced_by: table name -> the setting that forced it.
    exchange: a row-sharded table's exchange (`Exchange.AUTO`, another
      `Exchange`, or table name -> one of those).
    exchange_sigmas: the all-to-all's margin (`placement.owner_capacity`).
    row_layout: which rows a replica owns of a row-sharded table.
    dtypes: table name -> the dtype its rows are stored in (requested,
      where the backend is built from layouts; else its TableConfig's).
  """

  tables: Sequence[placement.TableSize]
  strategy: Any
  budget_bytes: float | None = None
  num_shards: int | None = None
  forced: Mapping[str, Placement] = dataclasses.field(default_factory=dict)
  forced_by: Mapping[str, str] = dataclasses.field(default_factory=dict)
  exchange: Exchange | Mapping[str, Exchange] = Exchange.AUTO
  exchange_sigmas: float = placement.CAPACITY_SIGMAS
  row_layout: RowLayout = RowLayout.CONTIGUOUS
  dtypes: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def dtype(self, table: str) -> str:
    """The dtype table `table`'s rows are stored in (default float32)."""
    return self.dtypes.get(table, "float32")

  @property
  def replicas(self) -> int:
    """The replicas in sync (at least 1)."""
    return max(1, int(self.strategy.num_replicas_in_sync))


@dataclasses.dataclass(frozen=True)
class TablePlan:
  """Where one table lives on this backend, what that costs, and why.

  Attributes:
    table: the table's name.
    shards: the devices its rows are split over (1: whole on each).
    bytes_per_device: the table and its slots one device holds.
    reason: why it is placed so ("" when nothing needs saying).
    row_sharded: split over the replicas by the backend's storage (the
      layout's "row_sharded" placement), not by its own devices.
    exchange_bytes: what one replica puts into collectives per step for
      it, None when not known.
    exchange: a row-sharded table's exchange (`placement.EXCHANGES`).
    layout: where its rows live and how, as the backend is built with and
      reports (`EmbeddingBackend.layouts()`); None: replicated (or
      row-sharded, by `row_sharded`) in the requested dtype.
  """

  table: str
  shards: int
  bytes_per_device: int
  reason: str = ""
  row_sharded: bool = False
  exchange_bytes: int | None = None
  exchange: str | None = None
  layout: TableLayout | None = None


@dataclasses.dataclass(frozen=True)
class BackendPlan:
  """A backend's answer: every table's `TablePlan`, and what it refuses.

  Attributes:
    tables: one per requested table, in the request's order.
    refusals: one line per table that does not fit a device even as placed.
    tables_in_process: the tables live on this process's devices (on CPU
      replicas: in its RAM); False when they live elsewhere (parameter
      servers), so the host's RAM does not hold them.
    advice: how to make tables fit that do not, on this backend (a clause
      the planner's refusal ends with, after "or").
  """

  tables: list[TablePlan]
  refusals: list[str] = dataclasses.field(default_factory=list)
  tables_in_process: bool = True
  advice: str = ""

  def check(self, backend: str, names: Sequence[str]) -> None:
    """Refuses an answer that is not about the tables asked about.

    Raises:
      PlanAnswerError: not one row per table in `names`, in order, or a
        row with no shard or bytes below 0, naming `backend`.
    """
    got = [placed.table for placed in self.tables]
    if got != list(names):
      raise PlanAnswerError(
        f"the {backend!r} backend's plan_tables answered for tables {got}; "
        f"it was asked about {list(names)}, in that order."
      )
    for placed in self.tables:
      if placed.shards < 1 or placed.bytes_per_device < 0:
        raise PlanAnswerError(
          f"the {backend!r} backend's plan_tables put table "
          f"{placed.table!r} on {placed.shards} shard(s) with "
          f"{placed.bytes_per_device} bytes per device; expected at least "
          "1 shard and bytes >= 0."
        )


def choose_shards(
  total_bytes: int, can_shard: int, budget: float | None, backend: str
) -> tuple[int, str]:
  """(shards, reason) for one table: whole if small, else split.

  A table takes at most `REPLICATE_SHARE` of the budget whole; bigger ones
  are split over `can_shard` devices (all of them when the budget is
  unknown). With `can_shard <= 1` every table is whole, and one over the
  budget alone is named.
  """
  if can_shard <= 1:
    if budget and total_bytes > budget:
      return 1, (
        f"{backend!r} replicates every table; this one alone is "
        f"{human_bytes(total_bytes)}, over a device's budget "
        f"{human_bytes(budget)}: it needs a sharding backend"
      )
    return 1, ""
  if budget is None:
    return can_shard, (
      f"device memory unknown: sharded over {can_shard} like "
      f"every table of {backend!r}"
    )
  share = total_bytes / budget
  limit = REPLICATE_SHARE * budget
  if total_bytes <= limit:
    return 1, (
      f"{human_bytes(total_bytes)} with slots is {share:.1%} of a "
      f"device's budget <= {REPLICATE_SHARE:.0%}: a full copy per "
      "device, lookups without network"
    )
  return can_shard, (
    f"{human_bytes(total_bytes)} with slots is {share:.1%} "
    f"of a device's budget > {REPLICATE_SHARE:.0%}: rows "
    f"split over {can_shard}"
  )


def split(
  size: placement.TableSize,
  shards: int,
  reason: str,
  layout: TableLayout | None = None,
) -> TablePlan:
  """`size` split over `shards` devices (1: whole), with `reason`, held
  as `layout` (None: see `TablePlan.layout`)."""
  where = placement.ROW_SHARDED if shards > 1 else placement.REPLICATED
  return TablePlan(
    size.name,
    shards,
    size.bytes_per_device(where, shards),
    reason,
    layout=layout,
  )


def whole_tables(
  request: PlanRequest,
  backend: str,
  where: Placement = Placement.REPLICATED,
) -> list[TablePlan]:
  """Every table whole on each device (`where`); one over the budget
  alone named."""
  return small_whole_big_split(request, 1, backend, where)


def small_whole_big_split(
  request: PlanRequest, can_shard: int, backend: str, where: Placement
) -> list[TablePlan]:
  """Each table whole while small, else split over `can_shard` devices;
  each held `where` (e.g. on the parameter servers)."""
  return [
    split(
      s,
      *choose_shards(s.total_bytes, can_shard, request.budget_bytes, backend),
      TableLayout(where, request.dtype(s.name)),
    )
    for s in request.tables
  ]


def every_table_split(
  request: PlanRequest, shards: int, reason: str, where: Placement
) -> list[TablePlan]:
  """Every table split over `shards` devices (`where`), for `reason`."""
  return [
    split(s, shards, reason, TableLayout(where, request.dtype(s.name)))
    for s in request.tables
  ]


def holds_every_table_whole(backend: str) -> str:
  """The advice of a backend that cannot split a table."""
  return (
    f"run on a host with more memory (the {backend!r} backend holds every "
    "table whole)"
  )
