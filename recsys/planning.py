"""What `recsys info` reports: the environment, backend choice, table memory.

`describe_environment` lists the devices, the strategy, the TPU embedding
feature, the backend "auto" would pick and why, and (given a feature config)
the memory plan. `plan_memory` chooses, per table, between replicated (a full
copy of the table and its optimizer slots on every device) and sharded (a
`1/N` row range per device: tpu_embedding over the TPU cores, sharded over
the parameter servers) from the table's size with its slots against a
device's memory: a backend that can shard keeps a table replicated while it
takes at most `REPLICATE_SHARE` of a device's budget, and shards bigger ones;
replicated backends (tensorcore, tpu_embedding_v0) replicate everything and
name the tables too big for that. It says what it chose and why, per table,
and warns before a configuration that cannot fit. Importable and runnable
without a TPU.

Example:
  >>> print(describe_environment(strategy, feature_config, Adagrad(0.05)))
"""

import dataclasses
import math
import os
import re
from typing import Any

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

import backends
from backends import hardware, registry
from backends import optimizers as embedding_optimizers
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

  @property
  def total_bytes(self) -> int:
    return self.table_bytes + self.slot_bytes

  @property
  def placement(self) -> str:
    return "replicated" if self.shards == 1 else f"sharded /{self.shards}"


@dataclasses.dataclass
class MemoryPlan:
  """Per-table rows, their total per device and the verdict."""

  backend: str
  rows: list[TableMemory]
  device_memory_bytes: int | None
  memory_source: str
  warnings: list[str]

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
    the tables are on accelerators or parameter servers)."""
    if not self.host_process:
      return None
    return self.bytes_per_device + self.fixed_overhead_bytes

  @property
  def fits(self) -> bool | None:
    """True/False against HEADROOM of device memory; None if unknown."""
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
    peak = self.predicted_peak_rss_bytes
    if peak is not None:
      out.append(
        f"predicted peak RSS of a training process: {human_bytes(peak)} = "
        f"tables and slots {human_bytes(self.bytes_per_device)} + fixed "
        f"overhead {human_bytes(self.fixed_overhead_bytes)} (TF runtime "
        f"{human_bytes(RUNTIME_BYTES)}, of which ~470 MiB TF's shared-library "
        f"pages; model, traced steps, input pipeline and evaluation "
        f"{human_bytes(LOOP_BYTES)})"
      )
    out.extend(
      f"{r.table}: {r.placement}: {r.reason}" for r in self.rows if r.reason
    )
    out.extend(f"WARNING: {w}" for w in self.warnings)
    return "\n".join(out)


def human_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(n) < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024.0
  return f"{n:.1f} TiB"


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
    features = nest.flatten(feature_config)
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
  from backends import sharded  # pylint: disable=g-import-not-at-top

  return max(1, sharded.num_tasks(strategy, "ps"))


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


def plan_memory(
  feature_config: Any,
  optimizer: Any | None = None,
  strategy: tf.distribute.Strategy | None = None,
  device_memory_bytes: int | None = None,
  backend: str = "auto",
  num_shards: int | None = None,
) -> MemoryPlan:
  """Bytes of each table and its slots per device, and whether they fit.

  Args:
    feature_config: nested structure of `FeatureConfig`.
    optimizer: default embedding optimizer for tables without their own.
    strategy: defaults to the current strategy.
    device_memory_bytes: one device's memory; default: host RAM (shared by
      the replicas on this host) on CPU, unknown on accelerators.
    backend: "auto" or a backend name: whether tables can be sharded.
    num_shards: how many devices (parameter servers, TPU cores) a sharded
      table is split over; default: the strategy's parameter servers for
      'sharded', its replicas for 'tpu_embedding'.

  Returns:
    A `MemoryPlan`; `plan.rows` has one `TableMemory` per table, `plan.fits`
    the verdict, `plan.format()` the printable table.
  """
  strategy = strategy or tf.distribute.get_strategy()
  name, _ = _resolve_backend(strategy, backend)
  sharded = backends.get(name).capabilities.sharded_tables
  if not sharded:
    can_shard = 1
  elif name == "sharded":
    can_shard = _num_parameter_servers(strategy)
  else:
    can_shard = max(1, strategy.num_replicas_in_sync)
  if sharded and num_shards is not None:
    can_shard = int(num_shards)
  source = "given"
  if device_memory_bytes is None:
    device_memory_bytes, source = _device_memory(strategy)
  budget = HEADROOM * device_memory_bytes if device_memory_bytes else None
  rows: list[Any] = []
  warnings: list[str] = []
  for i, table in enumerate(_tables(feature_config)):
    table_name = table.name if table.name is not None else f"table_{i}"
    opt = table.optimizer if table.optimizer is not None else optimizer
    slots = (
      tuple(embedding_optimizers.slot_names(opt)) if opt is not None else ()
    )
    width = table.dim * table.dtype.size
    table_bytes = table.vocabulary_size * width
    if name == "sharded":  # placement is a software choice: per table
      shards, reason = _choose(
        table_bytes * (1 + len(slots)), can_shard, budget, name
      )
    elif can_shard > 1:  # the TPU embedding engine shards every table
      shards, reason = (
        can_shard,
        (f"{name!r} shards every table over the {can_shard} TPU cores"),
      )
    else:
      shards, reason = _choose(table_bytes * (1 + len(slots)), 1, budget, name)
    rows_per_device = math.ceil(table.vocabulary_size / shards)
    rows.append(
      TableMemory(
        table=table_name,
        vocabulary_size=table.vocabulary_size,
        dim=table.dim,
        optimizer=type(opt).__name__ if opt is not None else "none",
        slots=slots,
        table_bytes=table_bytes,
        slot_bytes=len(slots) * table_bytes,
        shards=shards,
        bytes_per_device=rows_per_device * width * (1 + len(slots)),
        reason=reason,
      )
    )
  plan = MemoryPlan(name, rows, device_memory_bytes, source, warnings)
  if plan.fits is False and device_memory_bytes:
    budget = HEADROOM * device_memory_bytes
    biggest = max(rows, key=lambda r: r.bytes_per_device)
    placements = sorted({r.placement for r in rows})
    warnings.append(
      f"the embedding needs {human_bytes(plan.bytes_per_device)} per device "
      f"with the {name!r} backend ({', '.join(placements)}), over "
      f"{HEADROOM:.0%} of the {human_bytes(device_memory_bytes)} a device "
      f"has ({human_bytes(budget)}); the largest is table {biggest.table!r} "
      f"({human_bytes(biggest.bytes_per_device)}). Shard the tables "
      "('tpu_embedding' on TPUs with an embedding accelerator, 'sharded' on "
      "parameter servers), shrink vocabularies or dims, or use an optimizer "
      "with fewer slots (SGD 0, Adagrad 1, Adam/FTRL/AdagradMomentum 2)."
    )
  return plan


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
  raise MemoryPlanError(
    f"the embedding tables need {human_bytes(plan.bytes_per_device)} per "
    f"device, over {HEADROOM:.0%} of the "
    f"{human_bytes(plan.device_memory_bytes or 0)} "
    f"available ({plan.memory_source}): {listed}{more}. Cap the "
    "vocabularies (e.g. CriteoTSV.max_vocab_size, or --gin_file "
    "experiments/hardware/cpu_small.gin), lower EmbeddingSettings.dim, use "
    "an optimizer with fewer slots, or shard the tables; `recsys info "
    "--gin_file ...` prints the plan. To try anyway pass --skip_memory_check "
    "(gin: train.skip_memory_check = True)."
  )


def describe_environment(
  strategy: tf.distribute.Strategy | None = None,
  feature_config: Any | None = None,
  optimizer: Any | None = None,
  backend: str = "auto",
  device_memory_bytes: int | None = None,
) -> str:
  """The report of `recsys info`: devices, strategy, TPU, backend, memory.

  Args:
    strategy: defaults to the current strategy.
    feature_config: if given, the memory plan of its tables is appended.
    optimizer: default embedding optimizer of that config.
    backend: "auto" or a forced backend name.
    device_memory_bytes: see `plan_memory`.

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
      feature_config, optimizer, strategy, device_memory_bytes, backend
    )
    lines.append("embedding memory per device:")
    lines.extend("  " + line for line in plan.format().splitlines())
  return "\n".join(lines)
