"""What `recsys info` reports: the environment, backend choice, table memory.

`describe_environment` lists the devices, the strategy, the TPU embedding
feature, the backend "auto" would pick and why, and (given a feature config)
the memory plan. `plan_memory` chooses, per table, between replicated (a full
copy of the table and its optimizer slots on every device) and sharded (a
`1/N` row range per device) from the table's size with its slots against a
device's memory:

* tensorcore places each table on its replicas (`backends.placement`):
  replicated while the tables fit a device's budget, the largest row-sharded
  over the replicas when they do not, refused — naming the table, its bytes
  and the budget — when even that does not fit; a placement can be forced
  per table and the budget set (`EmbeddingPlacement`, e.g. to plan for a
  16 GiB device on a CPU box);
* sharded keeps a table whole on one parameter server while it takes at most
  `REPLICATE_SHARE` of a device's budget and splits bigger ones;
* tpu_embedding shards every table over the TPU cores; tpu_embedding_v0
  replicates everything and names the tables too big for that.

It says what it chose and why, per table, with the bytes per device and the
exchange per step, and warns before a configuration that cannot fit.
Importable and runnable without a TPU.

Example:
  >>> print(describe_environment(strategy, feature_config, Adagrad(0.05)))
"""

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import gin
import tensorflow as tf

import backends
from backends import hardware, registry
from backends import optimizers as embedding_optimizers
from backends import placement as placement_lib
from backends.placement import human_bytes
from recsys.errors import RecsysError

#: Fraction of device memory the embedding may use before a warning: the
#: rest is for activations, the model, the input pipeline.
HEADROOM = 0.8

#: With a backend that can shard, a table (with its slots) stays replicated
#: while it takes at most this share of a device's embedding budget
#: (HEADROOM x memory): its lookups then need no network or cross-device
#: traffic. Bigger tables are row-sharded over the devices or parameter
#: servers.
REPLICATE_SHARE = 0.1

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
    reason: why the planner replicated or sharded it.
    exchange_bytes: what one replica puts into collectives per step for it
      (ids, rows, gradients; `backends.placement`), None when not known.
    row_sharded: split over the replicas (tensorcore), not by the backend's
      own sharding (parameter servers, TPU cores).
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
  row_sharded: bool = False

  @property
  def total_bytes(self) -> int:
    return self.table_bytes + self.slot_bytes

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

  def placements(self) -> dict[str, str]:
    """Table name -> "replicated" / "row_sharded": tensorcore's `placement`."""
    return {
      r.table: "row_sharded" if r.row_sharded else "replicated"
      for r in self.rows
    }

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
    return self.memory_source.startswith("host RAM") and self.backend != (
      "sharded"
    )

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
      self.bytes_per_device * self.local_replicas + self.fixed_overhead_bytes
    )

  @property
  def fits(self) -> bool | None:
    """True/False against HEADROOM of device memory; None if unknown."""
    if self.refusals:
      return False
    if not self.device_memory_bytes:
      return None
    return self.bytes_per_device <= HEADROOM * self.device_memory_bytes

  def format(self) -> str:
    """A fixed-width table, the total, and any warnings."""
    header = (
      "table",
      "vocab",
      "dim",
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
        r.optimizer,
        str(len(r.slots)),
        human_bytes(r.table_bytes),
        human_bytes(r.slot_bytes),
        human_bytes(r.bytes_per_device),
        r.placement,
        "?" if r.exchange_bytes is None else human_bytes(r.exchange_bytes),
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
    exchange = self.exchange_bytes
    if exchange:
      out.append(
        f"exchange per step and replica: {human_bytes(exchange)} into "
        "collectives (ids, rows of row-sharded tables, row gradients)"
      )
    peak = self.predicted_peak_rss_bytes
    if peak is not None:
      replicas = (
        f" x {self.local_replicas} replicas" if self.local_replicas > 1 else ""
      )
      out.append(
        f"predicted peak RSS of a training process: {human_bytes(peak)} = "
        f"tables and slots {human_bytes(self.bytes_per_device)}{replicas} + "
        "fixed "
        f"overhead {human_bytes(self.fixed_overhead_bytes)} (TF runtime "
        f"{human_bytes(RUNTIME_BYTES)}, of which ~470 MiB TF's shared-library "
        f"pages; model, traced steps, input pipeline and evaluation "
        f"{human_bytes(LOOP_BYTES)})"
      )
    out.extend(
      f"{r.table}: {r.placement}: {r.reason}" for r in self.rows if r.reason
    )
    out.extend(f"REFUSED: {r}" for r in self.refusals)
    out.extend(f"WARNING: {w}" for w in self.warnings)
    return "\n".join(out)


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


def _num_parameter_servers(strategy: tf.distribute.Strategy) -> int:
  return max(1, hardware.num_tasks(strategy, "ps"))


def _choose(
  total_bytes: int, can_shard: int, budget: float | None, backend: str
) -> tuple[int, str]:
  """(shards, reason) for one table: replicated if small, else sharded."""
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


@gin.register
@dataclasses.dataclass(frozen=True)
class EmbeddingPlacement:
  """Where the planner may put tables, and how big a device is.

  Attributes:
    device_memory: one device's memory, in bytes or as text ("16GiB",
      "512MiB"); the tables may use `HEADROOM` of it. None: detected (host
      RAM shared by the local replicas on CPU; unknown on accelerators,
      where every table then stays replicated). Setting it on a CPU box
      plans as for that device, e.g. a TPU v5e chip's 16 GiB.
    tables: table name -> "replicated" or "row_sharded", forcing the
      tensorcore backend's placement of those tables (the others are
      planned); e.g. `{"C10": "row_sharded"}` in gin. Other backends place
      tables themselves and ignore it (so `recsys export`, on `serving`,
      reads a training config that sets it).
    row_layout: which rows a replica owns of a row-sharded table:
      "contiguous" (equal row ranges, default: checkpointed by slices) or
      "strided" (ids `r, r + R, ...`; the table is saved whole).

  Example (gin):
    train.placement = @EmbeddingPlacement()
    EmbeddingPlacement.device_memory = "16GiB"
    EmbeddingPlacement.tables = {"C10": "row_sharded"}
  """

  device_memory: int | str | None = None
  tables: Mapping[str, str] = dataclasses.field(default_factory=dict)
  row_layout: str = "contiguous"

  @property
  def device_memory_bytes(self) -> int | None:
    """`device_memory` in bytes (None: detect)."""
    return parse_bytes(self.device_memory, "EmbeddingPlacement.device_memory")


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_UNITS.update({"tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9})


def parse_bytes(value: int | str | None, where: str) -> int | None:
  """Bytes from an int or text like "16GiB", "1.5 GB", "4096".

  Raises:
    ValueError: naming `where`, for text that is no size or a size <= 0.
  """
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise ValueError(f"{where} = {value!r}; give bytes or text like '16GiB'.")
  number: float
  if isinstance(value, str):
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
      raise ValueError(
        f"{where} = {value!r} is not a size; give bytes or a number with "
        "one of the units B, KiB, MiB, GiB, TiB, KB, MB, GB (e.g. '16GiB')."
      )
    number = float(match.group(1)) * _UNITS[unit]
  else:
    number = value
  if number <= 0:
    raise ValueError(f"{where} = {value!r}; a device's memory must be > 0.")
  return int(number)


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
) -> MemoryPlan:
  """Bytes of each table and its slots per device, and whether they fit.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without their own.
    strategy: defaults to the current strategy.
    device_memory_bytes: one device's memory; default:
      `placement.device_memory`, else host RAM (shared by the replicas on
      this host) on CPU, unknown on accelerators.
    backend: "auto" or a backend name: whether tables can be sharded.
    num_shards: how many devices (parameter servers, TPU cores) a sharded
      table is split over; default: the strategy's parameter servers for
      'sharded', its replicas for 'tpu_embedding'.
    placement: forced placements and the per-device budget (tensorcore).
    ids_per_step: table name -> ids one replica looks up per step, for the
      exchange per step (`ids_per_step()`); None: not reported.

  Returns:
    A `MemoryPlan`; `plan.rows` has one `TableMemory` per table, `plan.fits`
    the verdict, `plan.format()` the printable table, `plan.placements()`
    tensorcore's `placement=` option.

  Raises:
    ValueError: `placement` names an unknown table or placement.
  """
  strategy = strategy or tf.distribute.get_strategy()
  placement = placement or EmbeddingPlacement()
  name, _ = _resolve_backend(strategy, backend)
  source = "given"
  if device_memory_bytes is None and placement.device_memory is not None:
    device_memory_bytes = placement.device_memory_bytes
    source = "EmbeddingPlacement.device_memory"
  if device_memory_bytes is None:
    device_memory_bytes, source = _device_memory(strategy)
  budget = HEADROOM * device_memory_bytes if device_memory_bytes else None
  tables = _tables(feature_config)
  if "placement" in backends.get(name).options:
    rows, refusals = _place_on_replicas(
      tables, optimizer, strategy, budget, placement, ids_per_step or {}
    )
  else:  # placements forced for tensorcore do not apply (e.g. export)
    rows, refusals = (
      _place_by_backend(tables, optimizer, strategy, budget, name, num_shards),
      [],
    )
  plan = MemoryPlan(
    name,
    rows,
    device_memory_bytes,
    source,
    [],
    refusals,
    local_replicas=len(_local_devices(strategy)) or 1,
  )
  if plan.fits is False and device_memory_bytes and not refusals:
    biggest = max(rows, key=lambda r: r.bytes_per_device)
    placements = sorted({r.placement for r in rows})
    plan.warnings.append(
      f"the embedding needs {human_bytes(plan.bytes_per_device)} per device "
      f"with the {name!r} backend ({', '.join(placements)}), over "
      f"{HEADROOM:.0%} of the {human_bytes(device_memory_bytes)} a device "
      f"has ({human_bytes(budget or 0)}); the largest is table "
      f"{biggest.table!r} ({human_bytes(biggest.bytes_per_device)}). Shard "
      "the tables ('tpu_embedding' on TPUs with an embedding accelerator, "
      "'sharded' on parameter servers, tensorcore row-sharded over several "
      "replicas), shrink vocabularies or dims, or use an optimizer with "
      "fewer slots (SGD 0, Adagrad 1, Adam/FTRL/AdagradMomentum 2)."
    )
  return plan


def _memory_row(
  i: int, table: Any, optimizer: Any, shards: int, **placed: Any
) -> TableMemory:
  """Table `i`'s `TableMemory`, split over `shards`, as placed."""
  opt = table.optimizer if table.optimizer is not None else optimizer
  slots = tuple(embedding_optimizers.slot_names(opt)) if opt is not None else ()
  width = table.dim * table.dtype.size
  placed.setdefault(
    "bytes_per_device",
    math.ceil(table.vocabulary_size / shards) * width * (1 + len(slots)),
  )
  return TableMemory(
    table=table.name if table.name is not None else f"table_{i}",
    vocabulary_size=table.vocabulary_size,
    dim=table.dim,
    optimizer=type(opt).__name__ if opt is not None else "none",
    slots=slots,
    table_bytes=table.vocabulary_size * width,
    slot_bytes=len(slots) * table.vocabulary_size * width,
    shards=shards,
    **placed,
  )


def _place_on_replicas(
  tables: list[Any],
  optimizer: Any,
  strategy: tf.distribute.Strategy,
  budget: float | None,
  placement: EmbeddingPlacement,
  ids: Mapping[str, int | None],
) -> tuple[list[TableMemory], list[str]]:
  """tensorcore: each table replicated or row-sharded over the replicas."""
  replicas = max(1, strategy.num_replicas_in_sync)
  whole = [_memory_row(i, t, optimizer, 1) for i, t in enumerate(tables)]
  sizes = [
    placement_lib.TableSize(
      r.table,
      r.vocabulary_size,
      r.dim,
      len(r.slots),
      ids.get(r.table),
      t.dtype.size,
    )
    for t, r in zip(tables, whole)
  ]
  plan = placement_lib.place_tables(sizes, replicas, budget, placement.tables)
  rows = []
  for i, (t, placed) in enumerate(zip(tables, plan.placements)):
    sharded = placed.placement == placement_lib.ROW_SHARDED
    rows.append(
      _memory_row(
        i,
        t,
        optimizer,
        replicas if sharded else 1,
        bytes_per_device=placed.bytes_per_device,
        reason=placed.reason,
        exchange_bytes=placed.exchange_bytes,
        row_sharded=sharded,
      )
    )
  return rows, plan.refusals


def _place_by_backend(
  tables: list[Any],
  optimizer: Any,
  strategy: tf.distribute.Strategy,
  budget: float | None,
  name: str,
  num_shards: int | None,
) -> list[TableMemory]:
  """Backends that place tables themselves (parameter servers, TPU cores)."""
  sharded = backends.get(name).capabilities.sharded_tables
  if not sharded:
    can_shard = 1
  elif name == "sharded":
    can_shard = _num_parameter_servers(strategy)
  else:
    can_shard = max(1, strategy.num_replicas_in_sync)
  if sharded and num_shards is not None:
    can_shard = int(num_shards)
  rows = []
  for i, table in enumerate(tables):
    total = _memory_row(i, table, optimizer, 1).bytes_per_device
    if name == "sharded":  # placement is a software choice: per table
      shards, reason = _choose(total, can_shard, budget, name)
    elif can_shard > 1:  # the TPU embedding engine shards every table
      shards, reason = (
        can_shard,
        (f"{name!r} shards every table over the {can_shard} TPU cores"),
      )
    else:
      shards, reason = _choose(total, 1, budget, name)
    rows.append(_memory_row(i, table, optimizer, shards, reason=reason))
  return rows


class MemoryPlanError(RecsysError, ValueError):
  """The embedding tables would not fit this host's memory."""


def check_fits(plan: MemoryPlan) -> None:
  """Refuses a plan that exceeds the device's memory, naming its tables.

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
  refused = "".join(f" {r[0].upper()}{r[1:]}." for r in plan.refusals)
  raise MemoryPlanError(
    f"the embedding tables need {human_bytes(plan.bytes_per_device)} per "
    f"device, over {HEADROOM:.0%} of the "
    f"{human_bytes(plan.device_memory_bytes or 0)} "
    f"available ({plan.memory_source}): {listed}{more}.{refused} Cap the "
    "vocabularies (e.g. CriteoTSV.max_vocab_size, or --gin_file "
    "experiments/hardware/cpu_small.gin), lower EmbeddingSettings.dim, use "
    "an optimizer with fewer slots, or shard the tables (tensorcore: "
    "row-sharded over several replicas, EmbeddingPlacement); `recsys info "
    "--gin_file ...` prints the plan. To try anyway pass --skip_memory_check "
    "(gin: train.skip_memory_check = True)."
  )


def describe_environment(
  strategy: tf.distribute.Strategy | None = None,
  feature_config: Any | None = None,
  optimizer: Any | None = None,
  backend: str = "auto",
  device_memory_bytes: int | None = None,
  placement: EmbeddingPlacement | None = None,
  ids_per_step: Mapping[str, int | None] | None = None,
) -> str:
  """The report of `recsys info`: devices, strategy, TPU, backend, memory.

  Args:
    strategy: defaults to the current strategy.
    feature_config: if given, the memory plan of its tables is appended.
    optimizer: default embedding optimizer of that config.
    backend: "auto" or a forced backend name.
    device_memory_bytes, placement, ids_per_step: see `plan_memory`.

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
  if feature_config is not None:
    plan = plan_memory(
      feature_config,
      optimizer,
      strategy,
      device_memory_bytes,
      backend,
      placement=placement,
      ids_per_step=ids_per_step,
    )
    lines.append("embedding memory per device:")
    lines.extend("  " + line for line in plan.format().splitlines())
  return "\n".join(lines)
