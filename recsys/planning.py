"""What `recsys info` reports: the environment, backend choice, table memory.

`describe_environment` lists the devices, the strategy, the TPU embedding
feature, the backend "auto" would pick and why, and (given a feature config)
the memory plan. `plan_memory` finds one device's memory (detected, or given:
`EmbeddingPlacement`, e.g. to plan for a 16 GiB device on a CPU box), checks
the placement settings, and asks the run's backend where each table goes
(`EmbeddingBackend.plan_tables`, `backends.table_plan`): whole on every
device or split over several, its bytes per device and why, and the tables
it refuses. Each backend answers for itself, so this module names none; it
renders the answer as one table, checks it against the budget and, when the
tables live in this process on its CPUs, against the host's RAM whatever
the budget, and warns before a configuration that cannot fit. The layouts
`EmbeddingPlacement` requests (forced placements, row layout, exchange,
storage dtype: each "one value, or table name -> value", read by the one
parser `backends.layout.per_table`) are the question's, and the answer is
one `TableLayout` per table (`MemoryPlan.layouts()`), what a backend built
from layouts is constructed with (`Capabilities.layouts`), so the plan is
what the backend holds. Importable and runnable without a TPU.

Example:
  >>> print(describe_environment(strategy, feature_config, Adagrad(0.05)))
"""

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any

import gin
import tensorflow as tf

import backends
from backends import hardware, registry, table_plan
from backends import layout as layout_lib
from backends import optimizers as embedding_optimizers
from backends import placement as placement_lib
from backends.placement import human_bytes
from recsys import ranges
from recsys.errors import RecsysError, SettingsError

#: Fraction of device memory the embedding may use before a warning: the
#: rest is for activations, the model, the input pipeline.
HEADROOM = 0.8

#: With a backend that splits tables as it likes (parameter servers), a
#: table stays whole while it takes at most this share of a device's
#: embedding budget (HEADROOM x memory): `backends.table_plan`'s rule.
REPLICATE_SHARE = table_plan.REPLICATE_SHARE

#: The fixed part of a CPU training process's peak RSS, besides its tables
#: and slots (issue 19, measured on a 2-core x86-64 host with TF 2.21 by
#: benchmarks/dlrm_vs_torchrec.py --memory and `recsys train` sampled on
#: experiments/synthetic_dlrm.gin). The TF runtime: `import tensorflow` and
#: recsys, ~470 MiB of it TF's shared-library pages (libtensorflow_cc mapped
#: in, shared with other TF processes) and ~215 MiB its heap.
RUNTIME_BYTES = 690 << 20
#: The training loop's own memory: the model, the traced train and eval
#: steps, the input pipeline's buffers, summaries and checkpoints (~80 MiB
#: in the benchmark's bare loop, ~120 MiB in `recsys train`'s whole run with
#: its evaluation on the default experiment).
LOOP_BYTES = 150 << 20


class PlacementSettingsError(SettingsError):
  """A setting the memory plan reads cannot be: `train.placement`, an
  `EmbeddingPlacement` field (a value out of range, an unknown table), or a
  table's layout given in the backend's options (its home is
  `EmbeddingPlacement`)."""


#: The backend options that were a table's layout, and their one home now.
MOVED_OPTIONS = {
  "placement": "EmbeddingPlacement.tables",
  "row_layout": "EmbeddingPlacement.row_layout",
  "exchange": "EmbeddingPlacement.exchange",
  "exchange_sigmas": "EmbeddingPlacement.exchange_sigmas",
  "table_dtype": "EmbeddingPlacement.table_dtype",
}


def refuse_layout_options(
  options: Mapping[str, Any] | None,
  where: str = "train.backend_options",
  home: str = "gin: train.placement = @EmbeddingPlacement()",
) -> None:
  """Refuses a table's layout given among a backend's options: it is
  requested in one place, `EmbeddingPlacement`, and planned.

  Args:
    options: the backend's options.
    where: the setting they come from, for the message.
    home: where an `EmbeddingPlacement` is given there, for the message.

  Raises:
    PlacementSettingsError: naming each such key and its new home.
  """
  moved = [key for key in MOVED_OPTIONS if key in (options or {})]
  if moved:
    homes = "; ".join(
      f"{where}[{key!r}] -> {MOVED_OPTIONS[key]}" for key in moved
    )
    raise PlacementSettingsError(
      f"{where} sets {moved}, a table's layout; set it in "
      f"EmbeddingPlacement instead ({homes}; {home}, e.g. "
      "EmbeddingPlacement(tables={'C10': 'row_sharded'})): the planner "
      "builds the backend from it."
    )


@dataclasses.dataclass(frozen=True)
class TableMemory:
  """One table's memory on one device.

  Attributes:
    table: table name.
    vocabulary_size, dim: the table's shape.
    optimizer: optimizer class name ("none" without one).
    slots: the optimizer's slot names (each the table's shape).
    table_bytes: the whole table.
    slot_bytes: all its slots, whole.
    shards: devices the rows are split over (1 = replicated).
    bytes_per_device: table and slots held by one device.
    reason: why the backend replicated or sharded it (its `plan_tables`).
    exchange_bytes: what one replica puts into collectives per step for it
      (ids, rows, gradients; `backends.placement`), None when not known.
    forced_by: the setting that forced its placement ("": planned).
    layout: where its rows live and how: what the backend is built with
      and reports (`EmbeddingBackend.layouts()`); `row_sharded`, `exchange`
      and `dtype` are read from it.
  """

  table: str
  vocabulary_size: int
  dim: int
  optimizer: str
  slots: tuple[str, ...]
  table_bytes: int
  slot_bytes: int
  shards: int
  bytes_per_device: int
  reason: str = ""
  exchange_bytes: int | None = None
  forced_by: str = ""
  layout: layout_lib.TableLayout = layout_lib.TableLayout()

  @property
  def row_sharded(self) -> bool:
    """Split over the replicas by the backend's storage (its layout's
    placement), not by its own devices (parameter servers, TPU cores)."""
    return self.layout.row_sharded

  @property
  def exchange(self) -> str | None:
    """A row-sharded table's exchange ("all_to_all", "all_gather")."""
    return self.layout.exchange.value if self.layout.exchange else None

  @property
  def dtype(self) -> str:
    """The dtype its rows are stored in ("float32", "bfloat16", ...:
    `EmbeddingPlacement.table_dtype`; slots stay float32)."""
    return str(self.layout.dtype)

  @property
  def total_bytes(self) -> int:
    return self.table_bytes + self.slot_bytes

  @property
  def index_bytes(self) -> int:
    """A dynamic vocabulary's index, held once per process on its host
    (0 for a table whose ids are its rows, or hashed)."""
    return self.process_index_bytes(1)

  def process_index_bytes(self, processes: int) -> int:
    """The most of its index one of `processes` worker processes holds
    (an index in shards is held apart by them)."""
    vocabulary = self.layout.vocabulary
    if vocabulary is None:
      return 0
    if not hasattr(vocabulary, "process_bytes"):  # hashed: no state
      return int(vocabulary.index_bytes(self.vocabulary_size))
    return int(vocabulary.process_bytes(self.vocabulary_size, processes))

  @property
  def placement(self) -> str:
    if self.row_sharded:
      return f"row_sharded /{self.shards}"
    return "replicated" if self.shards == 1 else f"sharded /{self.shards}"


@dataclasses.dataclass
class MemoryPlan:
  """Per-table rows, their total per device and the verdict."""

  backend: str
  rows: list[TableMemory]
  device_memory_bytes: int | None
  memory_source: str
  warnings: list[str]
  #: Tables (or the whole) that do not fit even as placed, one line each.
  refusals: list[str] = dataclasses.field(default_factory=list)
  #: The replicas in this process (logical CPUs hold one copy each).
  local_replicas: int = 1
  #: Worker processes training together (they hold index shards apart).
  worker_processes: int = 1
  #: Which rows a replica owns of a row-sharded table, as the backend is
  #: built with; None for backends not built from layouts.
  row_layout: str | None = None
  #: The all-to-all exchange's margin (`EmbeddingPlacement.exchange_sigmas`).
  exchange_sigmas: float = placement_lib.CAPACITY_SIGMAS
  #: This host's RAM, when the replicas are its CPUs (the tables live in
  #: this process) and a device's memory was given rather than detected:
  #: the tables must fit the host too, whatever the budget says.
  host_ram_bytes: int | None = None
  #: The backend's tables live on this process's devices (False: on
  #: parameter servers), so CPU replicas hold them in this host's RAM.
  tables_in_process: bool = True
  #: The backend trains (a training process's peak RSS is predicted).
  trains: bool = True
  #: How to make tables fit that do not, on this backend (its answer).
  advice: str = ""

  def layouts(self) -> dict[str, layout_lib.TableLayout]:
    """Table name -> its `TableLayout`: what the backend is built with (one
    built from layouts) and reports (`backend.layouts()`)."""
    return {r.table: r.layout for r in self.rows}

  def placements(self) -> dict[str, str]:
    """Table name -> its layout's placement ("replicated", ...)."""
    return {r.table: r.layout.placement.value for r in self.rows}

  @property
  def exchange_bytes(self) -> int | None:
    """What one replica puts into collectives per step (None: unknown)."""
    values = [r.exchange_bytes for r in self.rows]
    return None if None in values else sum(v or 0 for v in values)

  @property
  def bytes_per_device(self) -> int:
    return sum(r.bytes_per_device for r in self.rows)

  @property
  def host_process(self) -> bool:
    """Whether the tables live in this (CPU) training process's memory."""
    on_host = self.memory_source.startswith("host RAM") or bool(
      self.host_ram_bytes
    )
    return on_host and self.tables_in_process

  @property
  def host_bytes(self) -> int:
    """Tables and slots this process holds (every local replica's share),
    and its dynamic vocabularies' indices."""
    return self.bytes_per_device * self.local_replicas + self.index_bytes

  @property
  def index_bytes(self) -> int:
    """The dynamic vocabularies' indices in one process: each whole, or
    its share of the shards the worker processes hold apart."""
    processes = self.worker_processes if self.tables_in_process else 1
    return sum(r.process_index_bytes(processes) for r in self.rows)

  @property
  def host_fits(self) -> bool | None:
    """Whether the local replicas' tables fit `HEADROOM` of the host's RAM
    (None: not checked, the budget is the host's or not on this host)."""
    if not self.host_ram_bytes:
      return None
    return self.host_bytes <= HEADROOM * self.host_ram_bytes

  @property
  def over_budget(self) -> bool:
    """Whether the tables exceed `HEADROOM` of one device's memory."""
    memory = self.device_memory_bytes
    return bool(memory) and self.bytes_per_device > HEADROOM * (memory or 0)

  @property
  def fixed_overhead_bytes(self) -> int:
    """A training process's peak RSS besides its tables: runtime + loop."""
    return RUNTIME_BYTES + LOOP_BYTES

  @property
  def predicted_peak_rss_bytes(self) -> int | None:
    """Peak RSS of one CPU training process holding these tables (None when
    the tables are on accelerators or parameter servers): each of its
    replicas (logical CPUs) holds its devices' share."""
    if not self.host_process:
      return None
    return (
      self.bytes_per_device * self.local_replicas
      + self.index_bytes
      + self.fixed_overhead_bytes
    )

  @property
  def fits(self) -> bool | None:
    """True/False against HEADROOM of device memory (and of the host's RAM
    when the replicas are its CPUs); None if unknown."""
    if self.refusals or self.host_fits is False:
      return False
    if not self.device_memory_bytes:
      return None
    return not self.over_budget

  def format(self) -> str:
    """A fixed-width table, the total, and any warnings."""
    header = (
      "table",
      "vocab",
      "dim",
      "dtype",
      "optimizer",
      "slots",
      "table",
      "slots",
      "per device",
      "placement",
      "exchange/step",
    )
    lines = [header] + [
      (
        r.table,
        str(r.vocabulary_size),
        str(r.dim),
        r.dtype,
        r.optimizer,
        str(len(r.slots)),
        human_bytes(r.table_bytes),
        human_bytes(r.slot_bytes),
        human_bytes(r.bytes_per_device),
        r.placement,
        ("?" if r.exchange_bytes is None else human_bytes(r.exchange_bytes))
        + (f" ({r.exchange})" if r.exchange else ""),
      )
      for r in self.rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
      "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
      for line in lines
    ]
    total = f"total per device: {human_bytes(self.bytes_per_device)}"
    if self.device_memory_bytes:
      share = 100.0 * self.bytes_per_device / self.device_memory_bytes
      total += (
        f" of {human_bytes(self.device_memory_bytes)} "
        f"({self.memory_source}), {share:.1f}%"
      )
    else:
      total += f" (device memory unknown: {self.memory_source})"
    out.append(total)
    if self.host_ram_bytes:
      share = 100.0 * self.host_bytes / self.host_ram_bytes
      out.append(
        f"on this host: {self.local_replicas} replica(s) x "
        f"{human_bytes(self.bytes_per_device)} = "
        f"{human_bytes(self.host_bytes)} of its "
        f"{human_bytes(self.host_ram_bytes)} of RAM, {share:.1f}%"
      )
    dynamic = [r for r in self.rows if r.layout.vocabulary is not None]
    if dynamic:
      out.append(
        "raw ids: "
        + ", ".join(
          f"{r.table} {_vocabulary_text(r.layout.vocabulary)}" for r in dynamic
        )
        + (
          f"; the indices hold {human_bytes(self.index_bytes)} "
          + (
            "in each process"
            + (
              f" (its share of the shards the {self.worker_processes} "
              "processes hold apart)"
              if self.worker_processes > 1
              and any(
                getattr(r.layout.vocabulary, "shards", 1) > 1 for r in dynamic
              )
              else ""
            )
            if self.tables_in_process
            else "on the parameter servers, for every worker (a whole "
            "index on the first, shards on the servers in turn)"
          )
          if self.index_bytes
          else ""
        )
      )
    if self.row_layout and any(r.row_sharded for r in self.rows):
      out.append(f"row layout of the row-sharded tables: {self.row_layout}")
    crowded = self._crowding_indices()
    if crowded:
      shards = crowded[0].shards
      out.append(
        f"{', '.join(r.table for r in crowded)}: all-gather, their index "
        "filling the first rows first; DynamicVocabulary.shards = "
        f"{shards} (the rows divisible by it) spreads their ids over the "
        "replicas and keeps the all-to-all"
      )
    exchange = self.exchange_bytes
    if exchange:
      out.append(
        f"exchange per step and replica: {human_bytes(exchange)} into "
        "collectives (ids, rows of row-sharded tables, row gradients)"
      )
    peak = self.predicted_peak_rss_bytes
    if peak is not None and self.trains:  # a training process
      replicas = (
        f" x {self.local_replicas} replicas" if self.local_replicas > 1 else ""
      )
      indices = (
        f"indices {human_bytes(self.index_bytes)} + "
        if self.index_bytes
        else ""
      )
      out.append(
        f"predicted peak RSS of a training process: {human_bytes(peak)} = "
        f"tables and slots {human_bytes(self.bytes_per_device)}{replicas} + "
        f"{indices}fixed "
        f"overhead {human_bytes(self.fixed_overhead_bytes)} (TF runtime "
        f"{human_bytes(RUNTIME_BYTES)}, of which ~470 MiB TF's shared-library "
        f"pages; model, traced steps, input pipeline and evaluation "
        f"{human_bytes(LOOP_BYTES)})"
      )
    out.extend(self._reasons())
    out.extend(f"REFUSED: {r}" for r in self.refusals)
    if self.host_fits is False:
      out.append(f"REFUSED: {_host_refusal(self)}")
    out.extend(f"WARNING: {w}" for w in self.warnings)
    return "\n".join(out)

  def _crowding_indices(self) -> list[TableMemory]:
    """Row-sharded dynamic tables on the all-gather whose index shards do
    not spread their ids over the contiguous row shards
    (`placement.spreads_evenly`): what `_exchange_request` gives them."""
    if self.row_layout != layout_lib.RowLayout.CONTIGUOUS.value:
      return []
    return [
      r
      for r in self.rows
      if r.row_sharded
      and r.exchange == placement_lib.ALL_GATHER
      and _crowds_first_rows(r.layout.vocabulary, r.vocabulary_size, r.shards)
    ]

  def _reasons(self) -> list[str]:
    """Why tables are placed as they are, where it says more than the
    table's placement column: a table forced, sharded or alone over a
    device's budget, each; the reason the other tables share, once (none
    when each has its own, e.g. its size against the budget, or the plan
    has one replica). Tables with the same reason share a line."""
    budget = HEADROOM * (self.device_memory_bytes or 0)
    shown: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    for r in self.rows:
      if not r.reason:
        continue
      label = r.placement.split()[0]
      # "replicated: ...", "row_sharded over 4: ...": the column says it.
      reason = re.sub(rf"^{label}( over \d+)?: ", "", r.reason)
      alone_over = bool(budget) and r.bytes_per_device > budget
      if r.forced_by or r.shards > 1 or alone_over:
        shown.setdefault(f"{r.placement}: {reason}", []).append(r.table)
      else:
        others.setdefault(f"{r.placement}: {reason}", []).append(r.table)
    if len(others) == 1 and not any("one replica" in k for k in others):
      shown.update(others)
    every = len(self.rows)
    return [
      f"{'every table' if len(tables) == every else ', '.join(tables)}: "
      f"{reason}"
      for reason, tables in shown.items()
    ]


def _vocabulary_text(vocabulary: Any) -> str:
  """How a table maps raw ids, in a few words for the plan."""
  if getattr(vocabulary, "unknown", None) is None:
    return "hashed into its rows"
  text = f"dynamic ({vocabulary.eviction} eviction"
  if vocabulary.admit_after > 1:
    text += f", admitted after {vocabulary.admit_after}"
  if vocabulary.admit_probability < 1:
    text += f", with probability {vocabulary.admit_probability}"
  if vocabulary.shards > 1:
    text += f", index in {vocabulary.shards} shards"
  return text + f", unknown ids read {vocabulary.unknown})"


def _natural_key(name: Any) -> list:
  """Sort key that orders C2 before C10 (digit runs compare as numbers)."""
  return [
    int(part) if part.isdigit() else part
    for part in re.split(r"(\d+)", str(name))
  ]


def _tables(feature_config: Any) -> list[Any]:
  """The distinct tables, in the natural order of their features' names."""
  if isinstance(feature_config, dict):
    features = [
      feature_config[k] for k in sorted(feature_config, key=_natural_key)
    ]
  else:
    features = tf.nest.flatten(feature_config)
  tables: list[Any] = []
  for feature in features:
    if all(feature.table is not t for t in tables):
      tables.append(feature.table)
  return tables


def _local_devices(strategy: tf.distribute.Strategy) -> list[str]:
  try:
    return list(strategy.extended.worker_devices)
  except (AttributeError, RuntimeError):
    return []


def host_memory_bytes() -> int | None:
  """Physical RAM of this host (`/proc/meminfo` MemTotal, else sysconf)."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def _on_host_cpus(strategy: tf.distribute.Strategy) -> bool:
  """Whether the strategy's local replicas are this host's CPUs."""
  devices = _local_devices(strategy)
  kinds = {tf.DeviceSpec.from_string(d).device_type for d in devices} or {"CPU"}
  return kinds <= {"CPU"}


def _device_memory(
  strategy: tf.distribute.Strategy,
) -> tuple[int | None, str]:
  """Memory available to one device, and where that figure comes from."""
  devices = _local_devices(strategy)
  kinds = {tf.DeviceSpec.from_string(d).device_type for d in devices} or {"CPU"}
  if kinds <= {"CPU"}:
    ram = host_memory_bytes()
    if ram is None:
      return None, "host RAM unknown; pass device_memory_bytes"
    copies = max(1, len(devices))
    if copies == 1:
      return ram, "host RAM"
    return ram // copies, f"host RAM / {copies} replicas on this host"
  kind = sorted(kinds - {"CPU"})[0]
  return None, (
    f"{kind} memory is not reported by TensorFlow; pass "
    "device_memory_bytes (e.g. --device_memory_gb)"
  )


def _resolve_backend(strategy, backend: str) -> tuple[str, str]:
  """`registry.decide`'s choice, with why a forced backend cannot run here."""
  name, reason, why_not = registry.decide(backend, strategy)
  if why_not:
    return name, f"forced, but cannot run here: {why_not}"
  return name, reason


#: One value for every table, or a dict table name -> value.
_NAMES_OR_ONE = ranges.AnyOf((ranges.Text(), ranges.PerName(ranges.Text())))


@gin.register
@dataclasses.dataclass(frozen=True)
class EmbeddingPlacement:
  """Where the planner may put tables, and how big a device is.

  Attributes:
    device_memory: one device's memory, in bytes or as text ("16GiB",
      "512MiB"); the tables may use `HEADROOM` of it. None: detected (host
      RAM shared by the local replicas on CPU; unknown on accelerators,
      where every table then stays replicated). Setting it on a CPU box
      plans as for that device, e.g. a TPU v5e chip's 16 GiB; the tables
      the replicas hold must still fit the host's RAM, where they live.
      Not a fraction (0.9 is refused): the planner takes `HEADROOM` itself.
    tables: table name -> "replicated" or "row_sharded", forcing the
      placement of those tables on a backend built from layouts
      (`Capabilities.layouts`; the tables it does not name are planned);
      e.g. `{"C10": "row_sharded"}` in gin; one value forces every table.
      Other backends place tables themselves and ignore it (so `recsys
      export`'s serving copy reads a training config that sets it).
    row_layout: which rows a replica owns of a row-sharded table:
      "contiguous" (equal row ranges; None: the default; checkpointed by
      slices) or "strided" (ids `r, r + R, ...`; the table is saved whole).
    exchange: how the replicas exchange a row-sharded table's ids, rows and
      gradients: "auto" (per table, the one that moves fewer bytes per
      step), "all_to_all" (each id to its owner only), "all_gather", or
      table name -> one of those.
    exchange_sigmas: the all-to-all's margin per owner over its even share
      of a step's ids, in standard deviations of a uniform spread (5: odds
      of an overflow far below one in a million per step when ids spread
      evenly over the owners' rows).
    table_dtype: the dtype a table's rows are stored in: "float32"
      (default), "bfloat16" or "float16" (half the bytes; slots stay
      float32; `backends.storage.narrow`), on a backend built from layouts; one
      value for every table, or table name -> dtype (others float32).

    vocabularies: tables fed raw ids (any int64, or strings): table name
      -> `@DynamicVocabulary()` (`backends.vocabulary.DynamicVocabulary`:
      mapped to rows by an index with admission and eviction, no two ids
      sharing a row below the capacity, `vocabulary_size`) or
      `@HashedIds()` (hashed into the rows, collisions and all: the
      classic baseline), or one of them for every table; on a backend
      that maps ids (`Capabilities.dynamic_vocabularies`: tensorcore,
      parameter_servers, tpu_embedding_v0; tpu_embedding only those that
      never reuse a row, `EmbeddingBackend.vocabulary_problem`).
      Default: none, every table's ids are its rows.

  These are the one home of a table's layout: the backend's options
  (`train.backend_options`) refuse `placement`, `row_layout`, `exchange`,
  `exchange_sigmas` and `table_dtype`, naming the field here.

  Example (gin):
    train.placement = @EmbeddingPlacement()
    EmbeddingPlacement.device_memory = "16GiB"
    EmbeddingPlacement.tables = {"C10": "row_sharded"}
    EmbeddingPlacement.table_dtype = {"C10": "bfloat16"}
  """

  # The values of device_memory, tables, row_layout, exchange and
  # table_dtype are declared by their form here; `parse_bytes` and the
  # planner (`_requests`, through `backends.layout.per_table`) check what
  # they say (sizes, placements, layouts, exchanges, dtypes, the tables
  # named), in one place, before any table.
  device_memory: Annotated[
    int | float | str | None, ranges.AnyOf((ranges.Real(), ranges.Text()))
  ] = None
  tables: Annotated[Mapping[str, str] | str, _NAMES_OR_ONE] = dataclasses.field(
    default_factory=dict
  )
  row_layout: ranges.Name | None = None
  exchange: Annotated[str | Mapping[str, str], _NAMES_OR_ONE] = "auto"
  exchange_sigmas: ranges.Positive = placement_lib.CAPACITY_SIGMAS
  table_dtype: Annotated[str | Mapping[str, str], _NAMES_OR_ONE] = "float32"
  # Objects (each checks its own fields), checked by `_vocabularies`.
  vocabularies: Any = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    """Each field within its declared range (`recsys.ranges`), before any
    plan is made; the tables it names are checked against the run's."""
    ranges.check_fields(self)

  @property
  def device_memory_bytes(self) -> int | None:
    """`device_memory` in bytes (None: detect)."""
    return parse_bytes(self.device_memory, "EmbeddingPlacement.device_memory")


def bound_placement() -> EmbeddingPlacement:
  """The placement of a run that does not set `train.placement`: the
  parsed gin config's `EmbeddingPlacement.*` bindings, if any, else the
  defaults. Binding `EmbeddingPlacement.tables` alone means those tables,
  not a setting nothing reads (gin applies bindings only where a
  configurable is called through it)."""
  return gin.get_configurable(EmbeddingPlacement)()


def default_placement_bindings() -> list[str]:
  """Gin bindings that set every `EmbeddingPlacement` field to its default:
  for a run that must not plan as the training config's bindings say
  (`recsys export` holds the tables whole on the exporting host)."""
  defaults = EmbeddingPlacement()
  return [
    f"EmbeddingPlacement.{field.name} = {getattr(defaults, field.name)!r}"
    for field in dataclasses.fields(EmbeddingPlacement)
  ]


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_UNITS.update({"tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9})


#: What a memory size may be, for the errors that refuse one.
_SIZE_FORMS = (
  "give a whole number of bytes (e.g. 17179869184) or a number with one of "
  "the units B, KiB, MiB, GiB, TiB, KB, MB, GB (e.g. '16GiB', '1.5GB')"
)


def parse_bytes(value: int | float | str | None, where: str) -> int | None:
  """Bytes from an int or text like "16GiB", "1.5 GB", "4096".

  A number without a unit is bytes, so it must be whole: 0.9 or "0.5" (a
  fraction of the memory, meant or not) would be 0 bytes.

  Raises:
    PlacementSettingsError: naming `where` and the accepted forms, for
      text that is no size, a fraction of a byte, or a size <= 0.
  """
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise PlacementSettingsError(f"{where} = {value!r}; {_SIZE_FORMS}.")
  number: float
  unit = ""
  if isinstance(value, str):
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
      raise PlacementSettingsError(
        f"{where} = {value!r} is not a size; {_SIZE_FORMS}."
      )
    number = float(match.group(1)) * _UNITS[unit]
    if unit not in ("", "b"):  # "1.1GiB": a size, whatever its last byte
      number = round(number)
  else:
    number = value
  if number <= 0:
    raise PlacementSettingsError(
      f"{where} = {value!r}; a device's memory must be > 0: {_SIZE_FORMS}."
    )
  if number != int(number):
    fraction = " (a fraction?)" if number < 1 else ""
    raise PlacementSettingsError(
      f"{where} = {value!r} is {number!r} bytes{fraction}, not a whole "
      f"number: {_SIZE_FORMS}. It is one device's memory, not a share of "
      f"it (the planner keeps {HEADROOM:.0%} of it for the tables itself)."
    )
  return int(number)


@dataclasses.dataclass(frozen=True)
class _Requests:
  """What `EmbeddingPlacement` requests of the tables' layouts, parsed."""

  forced: dict[str, layout_lib.Placement]
  by: dict[str, str]
  row_layout: layout_lib.RowLayout
  exchange: layout_lib.Exchange | dict[str, layout_lib.Exchange]
  sigmas: float
  dtypes: dict[str, str]
  vocabularies: dict[str, Any]


def _requests(
  placement: EmbeddingPlacement,
  tables: list[Any],
  names: list[str],
  takes_layouts: bool,
) -> _Requests:
  """`placement`'s layout requests, each read by `layout_lib.per_table`.

  A backend built from layouts gets them all, its tables' names checked;
  the others place their tables themselves: only the values are checked
  (so `recsys export`'s serving copy reads a training config that sets
  them), and each table keeps its TableConfig's dtype.

  Raises:
    PlacementSettingsError: a value that is no placement, row layout,
      exchange or dtype, or (built from layouts) an unknown table; naming
      the field and the closest valid name.
  """
  check = names if takes_layouts else None
  field = "EmbeddingPlacement.{}".format
  try:
    forced = layout_lib.per_table(
      placement.tables,
      field("tables"),
      check,
      layout_lib.Placement.requestable(),
    )
    row_layout = layout_lib.value_of(
      placement.row_layout or layout_lib.RowLayout.CONTIGUOUS,
      layout_lib.RowLayout,
      field("row_layout"),
    )
    exchange: Any = placement.exchange
    if isinstance(exchange, Mapping):
      exchange = layout_lib.per_table(
        exchange, field("exchange"), check, layout_lib.Exchange
      )
    else:
      exchange = layout_lib.value_of(
        exchange, layout_lib.Exchange, field("exchange")
      )
    dtypes = layout_lib.per_table(
      placement.table_dtype,
      field("table_dtype"),
      check,
      layout_lib.StorageDtype,
      others=layout_lib.StorageDtype.FLOAT32,
    )
  except layout_lib.LayoutSettingError as e:
    raise PlacementSettingsError(str(e)) from e
  if takes_layouts:
    stored = {n: dtypes[n].value for n in names}
  else:
    stored = {n: t.dtype.name for t, n in zip(tables, names)}
  return _Requests(
    forced,
    {table: field("tables") for table in forced},
    row_layout,
    exchange,
    float(placement.exchange_sigmas),
    stored,
    _vocabularies(placement.vocabularies, field("vocabularies"), names),
  )


def vocabularies_of(
  placement: EmbeddingPlacement | None, names: list[str]
) -> dict[str, Any]:
  """Table name -> the vocabulary policy `placement` (None: the gin
  bindings') gives it, for the tables in `names` that have one."""
  placement = placement if placement is not None else bound_placement()
  return _vocabularies(
    placement.vocabularies, "EmbeddingPlacement.vocabularies", names
  )


def _vocabularies(
  value: Any, setting: str, names: list[str] | None
) -> dict[str, Any]:
  """Table name -> `DynamicVocabulary` from one for every table or a dict.

  Raises:
    PlacementSettingsError: a value that is no `DynamicVocabulary`, or an
      unknown table (with the closest names).
  """
  from backends.vocabulary import POLICIES  # noqa: PLC0415

  if isinstance(value, POLICIES):
    return {name: value for name in names or ()}
  if not isinstance(value, Mapping) or not all(
    isinstance(v, POLICIES) for v in value.values()
  ):
    raise PlacementSettingsError(
      f"{setting} = {value!r}; give @DynamicVocabulary() or @HashedIds() "
      "for every table, or a dict table name -> one of them."
    )
  if names is None:
    return {}
  try:
    layout_lib.refuse_unknown_tables(value, names, setting)
  except layout_lib.LayoutSettingError as e:
    raise PlacementSettingsError(str(e)) from e
  return dict(value)


def ids_per_step(
  feature_config: Mapping[str, Any],
  bag_widths: Mapping[str, int | None],
  per_replica_batch: int,
) -> dict[str, int | None]:
  """Ids one replica looks up in each table per step (None: unbounded).

  A feature adds `per_replica_batch` ids times its sequence length, its bag
  width, or 1 (one id per example); a multi-hot feature without a width has
  no bound.
  """
  out: dict[str, int | None] = {}
  for i, table in enumerate(_tables(feature_config)):
    total: int | None = 0
    for path, feature in feature_config.items():
      if feature.table is not table:
        continue
      width = feature.max_sequence_length or bag_widths.get(path, 1)
      total = None if total is None or width is None else total + width
    name = table.name if table.name is not None else f"table_{i}"
    out[name] = None if total is None else total * per_replica_batch
  return out


def plan_memory(
  feature_config: Any,
  optimizer: Any | None = None,
  strategy: tf.distribute.Strategy | None = None,
  device_memory_bytes: int | None = None,
  backend: str = "auto",
  num_shards: int | None = None,
  placement: EmbeddingPlacement | None = None,
  ids_per_step: Mapping[str, int | None] | None = None,
  backend_options: Mapping[str, Any] | None = None,
) -> MemoryPlan:
  """Bytes of each table and its slots per device, and whether they fit.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without their own.
    strategy: defaults to the current strategy.
    device_memory_bytes: one device's memory; default:
      `placement.device_memory`, else host RAM (shared by the replicas on
      this host) on CPU, unknown on accelerators.
    backend: "auto" or a backend name: the backend asked where each table
      goes (`plan_tables`).
    num_shards: how many devices (parameter servers, TPU cores) a split
      table goes over; default: the backend's own count.
    placement: the tables' layout requests (forced placements, row
      layout, exchange, storage dtype: for a backend built from layouts,
      `Capabilities.layouts`) and the per-device budget.
    ids_per_step: table name -> ids one replica looks up per step, for the
      exchange per step (`ids_per_step()`); None: not reported.
    backend_options: the backend's options (`train.backend_options`),
      refused when they set a table's layout (`MOVED_OPTIONS`).

  Returns:
    A `MemoryPlan`; `plan.rows` has one `TableMemory` per table, `plan.fits`
    the verdict, `plan.format()` the printable table, `plan.layouts()` the
    `TableLayout` of each table the backend is built with.

  Raises:
    PlacementSettingsError: `placement` is no `EmbeddingPlacement`, one of
      its fields cannot be (an unknown table, placement, row layout,
      exchange, dtype or size), or the backend options set a layout.
    backends.table_plan.PlanAnswerError: the backend's `plan_tables`
      answered about other tables than it was asked about.
  """
  strategy = strategy or tf.distribute.get_strategy()
  refuse_layout_options(backend_options)
  if placement is None:
    placement = bound_placement()
  elif not isinstance(placement, EmbeddingPlacement):
    raise PlacementSettingsError(
      f"train.placement is {placement!r}; expected @EmbeddingPlacement() "
      "(gin) or recsys.planning.EmbeddingPlacement(...)."
    )
  name, _ = _resolve_backend(strategy, backend)
  backend_cls = backends.get(name)
  tables = _tables(feature_config)
  takes_layouts = backend_cls.capabilities.layouts
  names = [_table_name(i, t) for i, t in enumerate(tables)]
  wanted = _requests(placement, tables, names, takes_layouts)
  capable = backend_cls.capabilities
  # A lookup-only backend (export's serving copy) reads the tables of a
  # dynamic run; the export maps raw ids with the checkpoint's index.
  if (
    wanted.vocabularies and capable.trains and not capable.dynamic_vocabularies
  ):
    raise PlacementSettingsError(
      f"EmbeddingPlacement.vocabularies makes tables "
      f"{sorted(wanted.vocabularies)} dynamic, but the {name!r} backend "
      "cannot map raw ids to rows; use a backend that can "
      f"({registry.dynamic_vocabulary_backends()}), or leave the tables "
      "static (ids in [0, vocabulary_size), e.g. hashed)."
    )
  if capable.dynamic_vocabularies:
    for table_name, vocabulary in sorted(wanted.vocabularies.items()):
      problem = backend_cls.vocabulary_problem(table_name, vocabulary)
      if problem:
        raise PlacementSettingsError(problem)
  source = "given"
  given = placement.device_memory_bytes  # checked whether used or not
  if device_memory_bytes is None and given is not None:
    device_memory_bytes = given
    source = "EmbeddingPlacement.device_memory"
  detected = device_memory_bytes is None
  if detected:
    device_memory_bytes, source = _device_memory(strategy)
  budget = HEADROOM * device_memory_bytes if device_memory_bytes else None
  element = {
    n: placement_lib.element_bytes(d) if takes_layouts else t.dtype.size
    for t, n, d in zip(tables, names, wanted.dtypes.values())
  }
  request = table_plan.PlanRequest(
    _table_sizes(tables, optimizer, ids_per_step or {}, element),
    strategy,
    budget,
    None if num_shards is None else int(num_shards),
    wanted.forced if takes_layouts else {},
    wanted.by if takes_layouts else {},
    _exchange_request(
      wanted,
      {n: t.vocabulary_size for n, t in zip(names, tables)},
      max(1, int(strategy.num_replicas_in_sync)),
    )
    if takes_layouts
    else layout_lib.Exchange.AUTO,
    wanted.sigmas if takes_layouts else placement_lib.CAPACITY_SIGMAS,
    wanted.row_layout,
    wanted.dtypes,
  )
  answer = backend_cls.plan_tables(request)
  answer.check(name, names)  # what the report renders
  host_ram = None
  if not detected and answer.tables_in_process and _on_host_cpus(strategy):
    host_ram = host_memory_bytes()  # the tables live there, whatever given
  rows = []
  for i, (table, placed) in enumerate(zip(tables, answer.tables)):
    held = placed.layout or _answered_layout(placed, request)
    if names[i] in wanted.vocabularies and capable.dynamic_vocabularies:
      held = dataclasses.replace(held, vocabulary=wanted.vocabularies[names[i]])
    rows.append(
      _memory_row(
        i,
        table,
        optimizer,
        placed.shards,
        element[names[i]],
        bytes_per_device=placed.bytes_per_device,
        reason=placed.reason,
        exchange_bytes=placed.exchange_bytes,
        forced_by=request.forced_by.get(placed.table, ""),
        layout=held,
      )
    )
  plan = MemoryPlan(
    name,
    rows,
    device_memory_bytes,
    source,
    [],
    list(answer.refusals),
    local_replicas=len(_local_devices(strategy)) or 1,
    worker_processes=hardware.synchronous_processes(strategy),
    row_layout=wanted.row_layout.value if takes_layouts else None,
    host_ram_bytes=host_ram,
    exchange_sigmas=request.exchange_sigmas,
    tables_in_process=answer.tables_in_process,
    trains=backend_cls.capabilities.trains,
    advice=answer.advice,
  )
  if plan.over_budget and not plan.refusals:
    biggest = max(rows, key=lambda r: r.bytes_per_device)
    placements = sorted({r.placement for r in rows})
    plan.warnings.append(
      f"the embedding needs {human_bytes(plan.bytes_per_device)} per device "
      f"with the {name!r} backend ({', '.join(placements)}), over "
      f"{HEADROOM:.0%} of the {human_bytes(device_memory_bytes or 0)} a device "
      f"has ({human_bytes(budget or 0)}); the largest is table "
      f"{biggest.table!r} ({human_bytes(biggest.bytes_per_device)}). Shard "
      f"the tables ({registry.sharding_backends()}), shrink vocabularies or "
      "dims, or use an optimizer with fewer slots (SGD 0, Adagrad 1, "
      "Adam/FTRL/AdagradMomentum 2)."
    )
  return plan


def _exchange_request(
  wanted: _Requests, sizes: Mapping[str, int], replicas: int
) -> Any:
  """The exchanges asked of the planner: as set, except that under "auto"
  and the contiguous row layout a dynamic-vocabulary table takes the
  all-gather unless its index is in shards that spread its ids evenly over
  the row shards (`placement.spreads_evenly`: e.g. `DynamicVocabulary.
  shards` = the replicas, the rows divisible by them). An index hands out
  rows in ascending order, so while it fills, a step's ids crowd the first
  contiguous shard and would overflow the all-to-all's even-share buckets
  (the all-gather never overflows; the strided layout spreads an
  ascending fill, and keeps the all-to-all)."""
  exchange = wanted.exchange
  if (
    exchange is not layout_lib.Exchange.AUTO
    or wanted.row_layout is not layout_lib.RowLayout.CONTIGUOUS
  ):
    return exchange
  filling = [
    name
    for name, vocabulary in wanted.vocabularies.items()
    if _crowds_first_rows(vocabulary, sizes[name], replicas)
  ]
  return {name: layout_lib.Exchange.ALL_GATHER for name in filling} or exchange


def _crowds_first_rows(
  vocabulary: Any, vocabulary_size: int, replicas: int
) -> bool:
  """Whether a table's vocabulary is a dynamic index whose shards do not
  spread a filling table's ids over `replicas` contiguous row shards
  (`placement.spreads_evenly`): its new ids crowd the first rows."""
  from backends.vocabulary import DynamicVocabulary  # noqa: PLC0415

  if not isinstance(vocabulary, DynamicVocabulary):
    return False  # static or hashed ids: spread as the data has them
  bounds = vocabulary.shard_bounds(vocabulary_size)
  return not placement_lib.spreads_evenly(bounds, vocabulary_size, replicas)


def _answered_layout(
  placed: table_plan.TablePlan, request: table_plan.PlanRequest
) -> layout_lib.TableLayout:
  """The layout of a table a backend's answer gave none (a third-party
  backend's): replicated, or row-sharded as it says, as requested."""
  return layout_lib.TableLayout(
    layout_lib.Placement.ROW_SHARDED
    if placed.row_sharded
    else layout_lib.Placement.REPLICATED,
    request.dtype(placed.table),
    request.row_layout,
    layout_lib.Exchange(placed.exchange) if placed.exchange else None,
    request.exchange_sigmas,
  )


def _table_sizes(
  tables: list[Any],
  optimizer: Any,
  ids: Mapping[str, int | None],
  element: Mapping[str, int],
) -> list[placement_lib.TableSize]:
  """Each table's size with its optimizer's slots and ids per step: what a
  backend's `plan_tables` is asked about; rows `element[name]` bytes per
  element, slots their TableConfig's."""
  sizes = []
  for i, table in enumerate(tables):
    whole = _memory_row(i, table, optimizer, 1)
    sizes.append(
      placement_lib.TableSize(
        whole.table,
        whole.vocabulary_size,
        whole.dim,
        len(whole.slots),
        ids.get(whole.table),
        element[whole.table],
        table.dtype.size,
      )
    )
  return sizes


def _table_name(i: int, table: Any) -> str:
  """A table's name (`table_<i>` for an unnamed one, as backends name it)."""
  return table.name if table.name is not None else f"table_{i}"


def _memory_row(
  i: int,
  table: Any,
  optimizer: Any,
  shards: int,
  dtype_bytes: int | None = None,
  **placed: Any,
) -> TableMemory:
  """Table `i`'s `TableMemory`, split over `shards`, as placed; its rows
  `dtype_bytes` per element (default: its TableConfig's), slots float32."""
  opt = table.optimizer if table.optimizer is not None else optimizer
  slots = tuple(embedding_optimizers.slot_names(opt)) if opt is not None else ()
  size = placement_lib.TableSize(
    _table_name(i, table),
    table.vocabulary_size,
    table.dim,
    len(slots),
    dtype_bytes=dtype_bytes or table.dtype.size,
    slot_dtype_bytes=table.dtype.size,
  )
  width = table.dim * size.slot_dtype_bytes
  placed.setdefault(
    "bytes_per_device",
    math.ceil(table.vocabulary_size / shards) * size.row_bytes,
  )
  return TableMemory(
    table=_table_name(i, table),
    vocabulary_size=table.vocabulary_size,
    dim=table.dim,
    optimizer=type(opt).__name__ if opt is not None else "none",
    slots=slots,
    table_bytes=table.vocabulary_size * table.dim * size.dtype_bytes,
    slot_bytes=len(slots) * table.vocabulary_size * width,
    shards=shards,
    **placed,
  )


class MemoryPlanError(RecsysError, ValueError):
  """The embedding tables would not fit this host's memory."""


def _host_refusal(plan: MemoryPlan) -> str:
  """Why the local replicas' tables do not fit this host's RAM."""
  ram = plan.host_ram_bytes or 0
  return (
    f"this run's {plan.local_replicas} replica(s) are this host's CPUs, so "
    f"its tables live in the host's RAM: {human_bytes(plan.host_bytes)} "
    f"({plan.local_replicas} x {human_bytes(plan.bytes_per_device)} of "
    f"tables and slots), over {HEADROOM:.0%} of its "
    f"{human_bytes(ram)} of RAM ({human_bytes(HEADROOM * ram)}), whatever "
    f"the device budget {plan.memory_source} = "
    f"{human_bytes(plan.device_memory_bytes or 0)} allows. On a CPU host "
    "leave EmbeddingPlacement.device_memory unset (the planner then takes "
    "the host's RAM shared by its replicas) or give what a replica really "
    "has here; train where the devices it plans for are"
  )


def check_fits(plan: MemoryPlan) -> None:
  """Refuses a plan that exceeds the device's memory, naming its tables.

  Checked against one device's budget (`HEADROOM` of its memory) and, when
  the replicas are this host's CPUs and a device's memory was given, against
  the host's RAM too: the tables are allocated there.

  Raises:
    MemoryPlanError: `plan.fits` is False; lists the largest tables with
      their shapes and bytes per device, and how to proceed.
  """
  if plan.fits is not False:
    return
  biggest = sorted(plan.rows, key=lambda r: -r.bytes_per_device)
  listed = ", ".join(
    f"{r.table} ({r.vocabulary_size} x {r.dim}, {len(r.slots)} slot(s): "
    f"{human_bytes(r.bytes_per_device)})"
    for r in biggest[:5]
  )
  more = f" and {len(biggest) - 5} smaller" if len(biggest) > 5 else ""
  problems = []
  if plan.over_budget or plan.host_fits is not False:
    problems.append(
      f"the embedding tables need {human_bytes(plan.bytes_per_device)} per "
      f"device, over {HEADROOM:.0%} of the "
      f"{human_bytes(plan.device_memory_bytes or 0)} "
      f"available ({plan.memory_source}): {listed}{more}."
    )
  else:
    problems.append(f"the largest tables: {listed}{more}.")
  if plan.host_fits is False:
    problems.append(_host_refusal(plan) + ".")
  problems.extend(f"{r[0].upper()}{r[1:]}." for r in plan.refusals)
  forced = [r for r in plan.rows if r.forced_by]
  if forced and plan.over_budget:
    by: dict[str, list[str]] = {}
    for r in forced:
      how = f"{r.placement.split()[0]}, forced by {r.forced_by}"
      by.setdefault(how, []).append(r.table)
    problems.append(
      "The planner moves no table whose placement is forced: "
      + "; ".join(f"{', '.join(t)} {how}" for how, t in by.items())
      + "."
    )
  shard = f"or {plan.advice}" if plan.advice else "or shard the tables"
  raise MemoryPlanError(
    " ".join(problems) + " Cap the vocabularies (e.g. "
    "CriteoTSV.max_vocab_size, or --gin_file "
    "experiments/hardware/cpu_small.gin), lower EmbeddingSettings.dim, use "
    f"an optimizer with fewer slots, {shard}; `recsys info --gin_file ...` "
    "prints the plan. To try anyway pass --skip_memory_check (gin: "
    "train.skip_memory_check = True)."
  )


def describe_environment(
  strategy: tf.distribute.Strategy | None = None,
  feature_config: Any | None = None,
  optimizer: Any | None = None,
  backend: str = "auto",
  device_memory_bytes: int | None = None,
  placement: EmbeddingPlacement | None = None,
  ids_per_step: Mapping[str, int | None] | None = None,
  backend_options: Mapping[str, Any] | None = None,
  plan: MemoryPlan | None = None,
) -> str:
  """The report of `recsys info`: devices, strategy, TPU, backend, memory.

  Args:
    strategy: defaults to the current strategy.
    feature_config: if given, the memory plan of its tables is appended.
    optimizer: default embedding optimizer of that config.
    backend: "auto" or a forced backend name.
    device_memory_bytes, placement, ids_per_step, backend_options: see
      `plan_memory`.
    plan: the memory plan to print, made already (what a run's settings
      give, `recsys.run.embedding_backend.plan_tables`); None: planned
      here from the arguments above when `feature_config` is given.

  Returns:
    Multi-line text.
  """
  strategy = strategy or tf.distribute.get_strategy()
  devices = [d.name for d in tf.config.list_logical_devices()]
  lines = [f"devices: {', '.join(devices) or 'none'}"]
  lines.append(
    f"strategy: {type(strategy).__name__} "
    f"({strategy.num_replicas_in_sync} replica(s))"
  )
  feature = hardware.embedding_feature(strategy)
  lines.append(
    "TPU embedding feature: "
    + (feature.name if feature is not None else "not a TPU")
  )
  name, reason = _resolve_backend(strategy, backend)
  lines.append(f"embedding backend: {backend} -> {name} ({reason})")
  lines.append(
    f"backends that can run here: {', '.join(backends.available(strategy))}"
  )
  if plan is None and feature_config is not None:
    plan = plan_memory(
      feature_config,
      optimizer,
      strategy,
      device_memory_bytes,
      backend,
      placement=placement,
      ids_per_step=ids_per_step,
      backend_options=backend_options,
    )
  if plan is not None:
    lines.append("embedding memory per device:")
    lines.extend("  " + line for line in plan.format().splitlines())
  return "\n".join(lines)
