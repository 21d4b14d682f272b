"""Chooses, per table, whether the replicas replicate it or row-shard it.

The `tensorcore` backend keeps each table either replicated (a full copy of
the rows and optimizer slots on every replica: lookups read locally, the
update exchanges only the touched rows' gradients) or row-sharded over the
`R` replicas (each holds `ceil(V / R)` rows and their slots; a step also
exchanges the looked-up rows). `place_tables` decides from the tables' sizes
and one device's budget:

1. a placement forced per table (`EmbeddingPlacement.tables`) is kept;
2. the other tables start replicated (no row exchange, the TensorCore path
   TF's `TPUEmbeddingV0` runs), and while the tables' bytes per device exceed
   the budget, the largest replicated table is row-sharded instead — the
   fewest, biggest tables move, so the fewest rows travel;
3. a table is refused — named with its bytes and the budget — when its
   bytes per device exceed the budget even row-sharded (or replicated, when
   forced so or on one replica); `Plan.bytes_per_device` over the budget
   means the tables do not fit together.

The exchange per step is counted as the payload one replica puts into the
collectives (`exchange_bytes`), from the static number of ids `C` a replica
looks up in a table per step.

Example:
  >>> sizes = [TableSize("big", 10_000_000, 64, num_slots=1, ids_per_step=512)]
  >>> plan = place_tables(sizes, replicas=4, budget_bytes=4 << 30)
  >>> plan.placements[0].placement
  'row_sharded'
"""

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence

#: Placements a table can have on the replicas.
REPLICATED, ROW_SHARDED = "replicated", "row_sharded"
PLACEMENTS = (REPLICATED, ROW_SHARDED)
#: Which rows a replica owns of a row-sharded table (`backends.storage.
#: row_layout`): equal row ranges (the default) or `r, r + R, ...`.
ROW_LAYOUTS = ("contiguous", "strided")
#: Contiguous row ranges: initialized, checkpointed and restored by row
#: slices where they live (docs/scaling.md).
DEFAULT_ROW_LAYOUT = ROW_LAYOUTS[0]
#: How a row-sharded table's replicas exchange ids, rows and gradients
#: (`backends.storage.exchange`); "auto": the one that moves fewer bytes.
ALL_GATHER, ALL_TO_ALL = "all_gather", "all_to_all"
EXCHANGES = (ALL_TO_ALL, ALL_GATHER)
#: The all-to-all's margin per owner over its even share of a step's ids,
#: in standard deviations of a uniform spread.
CAPACITY_SIGMAS = 5.0


def owner_capacity(
  ids: int, replicas: int, sigmas: float = CAPACITY_SIGMAS
) -> int:
  """Ids one replica may send one owner per step (`K`), of its `ids`.

  The even share `ids / R` plus `sigmas` standard deviations of a uniform
  spread (binomial), at least one more, at most `ids`: with ids spread
  evenly over the owners a bucket overflows with odds far below one in a
  million per step (5 sigmas).
  """
  if replicas <= 1:
    return ids
  share = ids / replicas
  spread = math.sqrt(share * (1.0 - 1.0 / replicas))
  return int(min(ids, math.ceil(share + sigmas * spread) + 1))


def contiguous_offsets(vocabulary_size: int, replicas: int) -> list[int]:
  """The `replicas + 1` row bounds of a table row-sharded in contiguous
  ranges: `ceil(V / R)` rows each, the last ones shorter (replica `r` owns
  rows `[offsets[r], offsets[r + 1])`)."""
  size = -(-vocabulary_size // replicas)
  return [min(r * size, vocabulary_size) for r in range(replicas)] + [
    vocabulary_size
  ]


def spreads_evenly(
  bounds: Sequence[int], vocabulary_size: int, replicas: int
) -> bool:
  """Whether row ranges `[bounds[i], bounds[i + 1])` (a dynamic table's
  index shards) lie each inside one contiguous row shard, as many in
  each: ids spread uniformly over those ranges (an id's index shard is a
  hash of the id) then reach every owner alike, as the all-to-all's
  buckets (`owner_capacity`) expect, however the ranges fill."""
  if replicas <= 1:
    return True
  offsets = contiguous_offsets(vocabulary_size, replicas)
  per_owner = [0] * replicas
  for start, end in zip(bounds[:-1], bounds[1:]):
    owner = bisect.bisect_right(offsets, start) - 1
    if end <= start or end > offsets[owner + 1]:
      return False  # an empty range, or one across two owners
    per_owner[owner] += 1
  return len(set(per_owner)) == 1


def exchange_bytes(
  exchange: str,
  ids: int,
  replicas: int,
  row_bytes: int,
  sigmas: float = CAPACITY_SIGMAS,
) -> int:
  """The payload one replica of a row-sharded table puts into collectives.

  all_gather: its `U` ids (int64), the owners' rows of all `R * U` ids
  (all-reduced) and its `U` gradients; all_to_all: `R` buckets of `K + 2`
  ids (the last two: a header, the bucket's count and the sender's
  largest), `K` rows and `K` gradients each.
  """
  if exchange == ALL_GATHER:
    return ids * (8 + row_bytes * (replicas + 1))
  k = owner_capacity(ids, replicas, sigmas)
  return replicas * ((k + 2) * 8 + 2 * k * row_bytes)


#: Bytes per element of each dtype a table's rows may be stored in
#: (`backends.storage.narrow.STORAGE_DTYPES`).
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Bytes per element of a row's gradient (float32, whatever the table's).
GRADIENT_BYTES = 4


def element_bytes(dtype: str) -> int:
  """Bytes per element of a table stored in `dtype` ("float32", ...).

  Raises:
    ValueError: a dtype no table is stored in.
  """
  if dtype not in ELEMENT_BYTES:
    raise ValueError(
      f"table dtype {dtype!r}; use one of {', '.join(ELEMENT_BYTES)}."
    )
  return ELEMENT_BYTES[dtype]


@dataclasses.dataclass(frozen=True)
class TableSize:
  """One table's shape, its optimizer's slots and its ids per step.

  Attributes:
    name: the table's name.
    vocabulary_size: its rows `V`.
    dim: its dimension `D`.
    num_slots: the optimizer's slots (each `[V, D]`).
    ids_per_step: the ids one replica looks up in it per step (`C`: the
      per-replica batch times the ids per example of its features), or None
      when unknown.
    dtype_bytes: bytes per element of the table's rows (float32: 4;
      bfloat16, float16: 2; `element_bytes`).
    slot_dtype_bytes: bytes per element of each slot (float32: 4).
  """

  name: str
  vocabulary_size: int
  dim: int
  num_slots: int = 0
  ids_per_step: int | None = None
  dtype_bytes: int = 4
  slot_dtype_bytes: int = 4

  @property
  def row_bytes(self) -> int:
    """One row with its slots."""
    return self.dim * (
      self.dtype_bytes + self.num_slots * self.slot_dtype_bytes
    )

  @property
  def total_bytes(self) -> int:
    """The whole table with its slots."""
    return self.vocabulary_size * self.row_bytes

  def bytes_per_device(self, placement: str, replicas: int) -> int:
    """Table and slots held by one device."""
    if placement == ROW_SHARDED:
      return math.ceil(self.vocabulary_size / replicas) * self.row_bytes
    return self.total_bytes

  def exchange_bytes(
    self,
    placement: str,
    replicas: int,
    exchange: str = ALL_GATHER,
    sigmas: float = CAPACITY_SIGMAS,
  ) -> int | None:
    """The payload one replica puts into collectives per step (None: unknown).

    Replicated (several replicas): its unique ids (int64) and their
    gradients are all-gathered. Row-sharded: `exchange_bytes` of its
    exchange.
    """
    if replicas <= 1:
      return 0
    if self.ids_per_step is None:
      return None
    ids = min(self.ids_per_step, self.vocabulary_size)
    if placement == ROW_SHARDED:
      row = self.dim * self.dtype_bytes
      return exchange_bytes(exchange, ids, replicas, row, sigmas)
    return ids * (8 + self.dim * GRADIENT_BYTES)  # float32 gradients

  def cheaper_exchange(self, replicas: int, sigmas: float) -> str:
    """The exchange that moves fewer bytes; all-gather when ids are unknown
    (the all-to-all needs a static number of ids per step)."""
    if self.ids_per_step is None or replicas <= 1:
      return ALL_GATHER
    by_bytes = {
      e: self.exchange_bytes(ROW_SHARDED, replicas, e, sigmas)
      for e in EXCHANGES
    }
    return min(EXCHANGES, key=lambda e: by_bytes[e] or 0)


@dataclasses.dataclass(frozen=True)
class TablePlacement:
  """Where one table lives, what that costs, and why."""

  table: str
  placement: str
  bytes_per_device: int
  exchange_bytes: int | None
  reason: str
  #: A row-sharded table's exchange (`EXCHANGES`); None when replicated.
  exchange: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
  """Every table's placement, and the reasons a plan does not fit.

  Attributes:
    placements: one per table, in the given order.
    refusals: one line per table that does not fit a device on its own.
  """

  placements: list[TablePlacement]
  refusals: list[str]

  def by_table(self) -> dict[str, str]:
    """Table name -> placement, the `tensorcore` backend's `placement=`."""
    return {p.table: p.placement for p in self.placements}

  @property
  def bytes_per_device(self) -> int:
    return sum(p.bytes_per_device for p in self.placements)


def check_forced(forced: Mapping[str, str], names: Sequence[str]) -> None:
  """Refuses unknown tables or placements in a forced placement.

  Raises:
    ValueError: naming the unknown table (with the valid ones) or value.
  """
  unknown = sorted(set(forced) - set(names))
  if unknown:
    raise ValueError(
      f"placement names unknown tables {unknown}; the tables are "
      f"{sorted(names)}."
    )
  for name, value in forced.items():
    if value not in PLACEMENTS:
      raise ValueError(
        f"placement[{name!r}] = {value!r}; use one of {', '.join(PLACEMENTS)}."
      )


def place_tables(
  sizes: Sequence[TableSize],
  replicas: int,
  budget_bytes: float | None,
  forced: Mapping[str, str] | None = None,
  forced_by: Mapping[str, str] | None = None,
  exchange: str | Mapping[str, str] = "auto",
  sigmas: float = CAPACITY_SIGMAS,
) -> Plan:
  """Each table's placement on `replicas` replicas within `budget_bytes`.

  Args:
    sizes: the tables.
    replicas: the replicas in sync (1: every table replicated).
    budget_bytes: what one device may hold of tables and slots; None:
      unknown (every table not forced stays replicated).
    forced: table name -> "replicated" or "row_sharded", kept as given.
    forced_by: table name -> the setting that forced it, for the reasons
      and refusals (default: "placement setting").
    exchange: a row-sharded table's exchange: "auto" (the one that moves
      fewer bytes), one of `EXCHANGES`, or table name -> one of those.
    sigmas: the all-to-all's margin (`owner_capacity`).

  Returns:
    The `Plan`: each table fits a device when its `refusals` are empty, all
    of them when its `bytes_per_device` is within the budget too.

  Raises:
    ValueError: `forced` names an unknown table or placement.
  """
  forced = dict(forced or {})
  check_forced(forced, [s.name for s in sizes])
  by = {
    name: (forced_by or {}).get(name, "placement setting") for name in forced
  }
  chosen = {s.name: forced.get(s.name, REPLICATED) for s in sizes}

  def total() -> int:
    return sum(s.bytes_per_device(chosen[s.name], replicas) for s in sizes)

  replicated_total = total()
  if budget_bytes is not None and replicas > 1:
    movable = sorted(
      (s for s in sizes if s.name not in forced),
      key=lambda s: -s.total_bytes,
    )
    for size in movable:
      if total() <= budget_bytes:
        break
      chosen[size.name] = ROW_SHARDED
  placements = []
  refusals = []
  for s in sizes:
    where = chosen[s.name]
    per_device = s.bytes_per_device(where, replicas)
    how = None
    if where == ROW_SHARDED:
      how = exchange if isinstance(exchange, str) else exchange.get(s.name)
      if how in (None, "auto"):
        how = s.cheaper_exchange(replicas, sigmas)
    placements.append(
      TablePlacement(
        s.name,
        where,
        per_device,
        s.exchange_bytes(where, replicas, how or ALL_GATHER, sigmas),
        _reason(s, where, by, replicas, budget_bytes, replicated_total),
        how,
      )
    )
    if budget_bytes is not None and per_device > budget_bytes:
      refusals.append(_refusal(s, where, replicas, budget_bytes, by))
  return Plan(placements, refusals)


def _reason(
  size: TableSize,
  where: str,
  forced_by: Mapping[str, str],
  replicas: int,
  budget: float | None,
  replicated_total: int,
) -> str:
  if size.name in forced_by:
    return f"{where}: forced ({forced_by[size.name]})"
  if replicas <= 1:
    return "replicated: one replica"
  if budget is None:
    return (
      "replicated: a device's memory is unknown (set a per-device budget "
      "to let the planner row-shard)"
    )
  if where == REPLICATED:
    return (
      f"replicated: {human_bytes(size.total_bytes)} with slots; the tables fit "
      f"the per-device budget {human_bytes(budget)}"
    )
  return (
    f"row_sharded over {replicas}: {human_bytes(size.total_bytes)} with "
    f"slots; all replicated the tables need {human_bytes(replicated_total)} "
    f"per device, over the budget {human_bytes(budget)} (the largest are "
    "sharded first)"
  )


def _refusal(
  size: TableSize,
  where: str,
  replicas: int,
  budget: float,
  forced_by: Mapping[str, str],
) -> str:
  per_device = size.bytes_per_device(where, replicas)
  if where == ROW_SHARDED:
    how = f"even row-sharded over {replicas} replica(s)"
    fix = (
      "add replicas, shrink the vocabulary or dim, or use an optimizer "
      "with fewer slots"
    )
  else:
    how = "replicated"
    fix = (
      "place it 'row_sharded'"
      if replicas > 1
      else "train on several replicas with it row-sharded"
    )
    if size.name in forced_by:
      how = f"replicated (forced by {forced_by[size.name]})"
  return (
    f"table {size.name!r} needs {human_bytes(per_device)} per device {how} "
    f"({size.vocabulary_size} x {size.dim}, {size.num_slots} slot(s)), over "
    f"the per-device budget {human_bytes(budget)}: {fix}"
  )


def human_bytes(n: float) -> str:
  """`n` bytes in B, KiB, MiB, GiB or TiB."""
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(n) < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024.0
  return f"{n:.1f} TiB"
