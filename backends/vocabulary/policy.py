"""A dynamic-vocabulary table's settings (`DynamicVocabulary`), each valid
range declared once next to its field, and their checks.

A dynamic table keeps TF's `TableConfig` (its `vocabulary_size` is the row
capacity) and puts an index (`backends.vocabulary.index`) in front of it
that maps raw ids to rows: an id gets a row once it has been seen often
enough (`admit_after`, counted by a count-min sketch), and when the rows run
out one is taken back from an id by the `eviction` rule. This module holds
the settings only (no TensorFlow), so a run can check them before TF starts.

Example:
  >>> policy = DynamicVocabulary(admit_after=3, eviction="lfu")
  >>> policy.eviction
  <Eviction.LFU: 'lfu'>
  >>> policy.check("users", vocabulary_size=1000)
  >>> DynamicVocabulary(eviction="lur")
  Traceback (most recent call last):
  VocabularySettingError: DynamicVocabulary.eviction = 'lur'; use one of
  'none', 'lru', 'lfu', 'age'. Did you mean 'lru'?
"""

import dataclasses
import enum
import functools
import math
import numbers
import typing
from typing import Annotated, Any

from backends.errors import BackendSettingsError
from backends.layout import LayoutSettingError, StrEnum, value_of

#: TF counts ids, steps and rows in int64.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: The widest count-min sketch (per hash row): 2 rows of int64 at this
#: width hold 64 GiB; an automatic width past it means the capacity is
#: too large for one index.
MAX_SKETCH_WIDTH = 2**32
#: The narrowest sketch one may ask for.
MIN_SKETCH_WIDTH = 16
#: The automatic sketch width is at least this, and `SKETCH_SLACK` times
#: the capacity, rounded up to a power of 2.
MIN_AUTO_SKETCH_WIDTH = 1024
SKETCH_SLACK = 4


#: The count-min sketch's hash rows.
SKETCH_ROWS = 2
#: Bytes an id costs the id table, the larger of its two kinds: TF's
#: `MutableHashTable` (int64 -> int64, a chained map; measured, RSS: 35
#: bytes an entry at 10**5 entries, 43 at 10**6) and the fused kernels'
#: `RecsysIdTable` (16-byte slots, a power of two >= 5/4 of the rows: 20-40
#: bytes a row, allocated at the start).
HASH_TABLE_BYTES_PER_ID = 48


class VocabularySettingError(BackendSettingsError, ValueError):
  """A `DynamicVocabulary` setting that cannot be: out of its range, of the
  wrong type, contradicting another, or impossible for its table."""


class Eviction(StrEnum):
  """Which id loses its row when a new id needs one and none is free."""

  #: None: a new id that finds no free row gets none (reads the default).
  NONE = "none"
  #: The row whose id was seen least recently.
  LRU = "lru"
  #: The row whose id was seen least often since it got the row.
  LFU = "lfu"
  #: Rows not seen for more than `max_age` steps are freed every
  #: `evict_every` steps; when still full, as "lru".
  AGE = "age"


class UnknownIds(StrEnum):
  """What an id without a row reads (the caller applies it)."""

  #: A row of zeros (no gradient flows to it).
  ZEROS = "zeros"
  #: A trained row of its own, the table's last (`vocabulary_size - 1`).
  UNKNOWN_ROW = "unknown_row"


@dataclasses.dataclass(frozen=True)
class Int:
  """An int (not a bool) in [low, high], or one of `also`; `note` says what
  values mean."""

  low: int
  high: int = INT64_MAX
  also: tuple[int, ...] = ()
  note: str = ""

  def problem(self, value: Any) -> str | None:
    """What the value must be when it is not valid, else None."""
    if not isinstance(value, bool) and isinstance(value, numbers.Integral):
      if self.low <= int(value) <= self.high or int(value) in self.also:
        return None
    return self.describe()

  def describe(self) -> str:
    high = "2**63 - 1" if self.high == INT64_MAX else str(self.high)
    low = "-2**63" if self.low == INT64_MIN else str(self.low)
    also = "".join(f"{v} or " for v in self.also)
    return f"{also}an integer in [{low}, {high}]"


@dataclasses.dataclass(frozen=True)
class Probability:
  """A finite number (not a bool) in (0, 1]."""

  note: str = ""

  def problem(self, value: Any) -> str | None:
    """What the value must be when it is not valid, else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
      number = float(value)
      if math.isfinite(number) and 0 < number <= 1:
        return None
    return "a number in (0, 1]"


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of an enum's members or its string."""

  kind: type[enum.Enum]
  note: str = ""


Spec = Int | Probability | Choice


@dataclasses.dataclass(frozen=True)
class DynamicVocabulary:
  """How a dynamic table's index admits ids to rows and takes rows back.

  Each field's valid values are declared in its annotation (`Int`,
  `Probability`, `Choice`) and checked on construction; `check` adds what
  depends on the table. Enum fields take their strings (gin files spell
  them) and hold the members.

  Attributes:
    admit_after: occurrences (counted by the count-min sketch, which may
      overcount) before an id gets a row; 1: at its first occurrence.
    admit_probability: an id that reached `admit_after` is admitted at a
      step with this probability (decided by a hash of the seed, the id
      and the step: the same on every run); 1: always.
    eviction: which row a new id takes when none is free (`Eviction`).
    max_age: "age" only: a row whose id was not seen for more than this
      many steps is freed at the next sweep.
    evict_every: "age" only: steps between sweeps (a sweep reads every
      row); 1: every step.
    unknown: what an id without a row reads (`UnknownIds`); "unknown_row"
      keeps the table's last row for them.
    sketch_width: columns of each of the sketch's two hash rows (of each
      shard's sketch); 0: auto, `max(1024, 4 * rows)` of the shard's rows
      rounded up to a power of 2.
    shards: the index split by a hash of the id into this many shards,
      each owning a contiguous range of the rows (`shard_bounds`) with its
      own sketch, admissions and eviction: an id only ever takes a row of
      its shard's range, so a full shard evicts while another may have
      rows free. The unit of placement: parameter servers hold a shard
      each, in turn. 1: one index over every row. The same number of
      shards decides alike on any number of replicas, workers or servers.
    seed: the hashes' seed (any int64).
  """

  admit_after: Annotated[int, Int(1)] = 1
  admit_probability: Annotated[float, Probability()] = 1.0
  eviction: Annotated[Eviction | str, Choice(Eviction)] = Eviction.LRU
  max_age: Annotated[int, Int(0, note='>= 1 with eviction "age", else 0')] = 0
  evict_every: Annotated[
    int, Int(1, note='only eviction "age" sweeps; others keep 1')
  ] = 1
  unknown: Annotated[UnknownIds | str, Choice(UnknownIds)] = UnknownIds.ZEROS
  sketch_width: Annotated[
    int, Int(MIN_SKETCH_WIDTH, MAX_SKETCH_WIDTH, also=(0,), note="0: auto")
  ] = 0
  shards: Annotated[int, Int(1, note="at most the table's id rows")] = 1
  seed: Annotated[int, Int(INT64_MIN)] = 0

  def __post_init__(self) -> None:
    put = functools.partial(object.__setattr__, self)
    for field, spec in specs().items():
      value = getattr(self, field)
      setting = f"DynamicVocabulary.{field}"
      if isinstance(spec, Choice):
        try:
          put(field, value_of(value, spec.kind, setting))
        except LayoutSettingError as e:
          raise VocabularySettingError(str(e)) from e
        continue
      expected = spec.problem(value)
      if expected is not None:
        raise VocabularySettingError(_refusal(setting, value, expected, spec))
      put(field, int(value) if isinstance(spec, Int) else float(value))
    self._check_consistent()

  def _check_consistent(self) -> None:
    """Refuses settings that contradict each other."""
    age = self.eviction is Eviction.AGE
    if age and self.max_age == 0:
      raise VocabularySettingError(
        'DynamicVocabulary.max_age = 0 with eviction "age"; give max_age '
        ">= 1 (steps a row may go unseen before a sweep frees it), or "
        'another eviction ("lru", "lfu", "none").'
      )
    if not age and self.max_age != 0:
      raise VocabularySettingError(
        f"DynamicVocabulary.max_age = {self.max_age} with eviction "
        f'"{self.eviction}"; max_age applies to eviction "age" only: use '
        'eviction="age", or leave max_age at 0.'
      )
    if not age and self.evict_every != 1:
      raise VocabularySettingError(
        f"DynamicVocabulary.evict_every = {self.evict_every} with eviction "
        f'"{self.eviction}"; only eviction "age" sweeps (every evict_every '
        'steps): use eviction="age", or leave evict_every at 1.'
      )

  def id_rows(self, vocabulary_size: int) -> int:
    """The rows ids may take: the table's, less the last one with
    unknown "unknown_row" (it holds what unknown ids read)."""
    if self.unknown is UnknownIds.UNKNOWN_ROW:
      return vocabulary_size - 1
    return vocabulary_size

  def unknown_row(self, vocabulary_size: int) -> int | None:
    """The row unknown ids read (the table's last) with unknown
    "unknown_row"; None with "zeros" (they read zeros)."""
    if self.unknown is UnknownIds.UNKNOWN_ROW:
      return vocabulary_size - 1
    return None

  def shard_bounds(self, vocabulary_size: int) -> list[int]:
    """The `shards + 1` row bounds of the shards: shard `s` owns rows
    `[bounds[s], bounds[s + 1])` of the id rows, as even as can be."""
    rows = self.id_rows(vocabulary_size)
    return [s * rows // self.shards for s in range(self.shards + 1)]

  def shard_policy(self) -> "DynamicVocabulary":
    """The policy of one shard's index: these settings over the shard's
    rows alone (no shards of its own; unknown ids are the table's)."""
    return dataclasses.replace(self, shards=1, unknown=UnknownIds.ZEROS)

  def index_bytes(self, vocabulary_size: int) -> int:
    """Bytes of state a table's index holds, its hash table full (the
    memory planner's figure): per row 25 (keys, occupied, counts,
    last_seen; 33 with eviction "age"'s free list) and
    `HASH_TABLE_BYTES_PER_ID`, and the sketch's 16 per column; of every
    shard with shards > 1 (`shard_bytes`)."""
    if self.shards > 1:
      return sum(self.shard_bytes(vocabulary_size))
    per_row = 8 + 1 + 8 + 8 + HASH_TABLE_BYTES_PER_ID
    if self.eviction is Eviction.AGE:
      per_row += 8
    scalars = 8 * (7 if self.eviction is Eviction.AGE else 5)
    rows = self.id_rows(vocabulary_size)
    sketch = 8 * SKETCH_ROWS * self.sketch_columns(vocabulary_size)
    return per_row * rows + sketch + scalars

  def held_shards(self, process: int, processes: int) -> list[int]:
    """The shards process `process` of `processes` worker processes holds
    when they hold them apart: shard `s` is process `s mod processes`'s
    (every shard with one process)."""
    return [s for s in range(self.shards) if s % processes == process]

  def process_bytes(self, vocabulary_size: int, processes: int) -> int:
    """The most index bytes one of `processes` worker processes holds
    (`held_shards`); the whole index with one."""
    each = self.shard_bytes(vocabulary_size)
    if len(each) == 1:
      return sum(each)
    return max(
      sum(each[s] for s in self.held_shards(p, processes))
      for p in range(max(1, processes))
    )

  def shard_bytes(self, vocabulary_size: int) -> list[int]:
    """`index_bytes` of each shard (one figure with shards = 1)."""
    if self.shards == 1:
      return [self.index_bytes(vocabulary_size)]
    bounds, shard = self.shard_bounds(vocabulary_size), self.shard_policy()
    return [shard.index_bytes(b - a) for a, b in zip(bounds, bounds[1:])]

  def sketch_columns(self, vocabulary_size: int) -> int:
    """Columns of each sketch row: `sketch_width`, or the automatic width
    (`max(1024, 4 * capacity)` rounded up to a power of 2) when it is 0 —
    or the narrowest, `MIN_SKETCH_WIDTH`, when `admit_after` is 1: every
    id is then admitted at its first sight and the sketch decides nothing
    (a full-width one cost 16 MiB and a cache miss per id at 200k rows)."""
    if self.sketch_width:
      return self.sketch_width
    if self.admit_after == 1:
      return MIN_SKETCH_WIDTH
    wanted = max(
      MIN_AUTO_SKETCH_WIDTH, SKETCH_SLACK * self.id_rows(vocabulary_size)
    )
    return 1 << (wanted - 1).bit_length()

  def check(self, table: str, vocabulary_size: int) -> None:
    """Checks what depends on the table.

    Args:
      table: the table's name, for the errors.
      vocabulary_size: the table's `TableConfig.vocabulary_size` (its rows).

    Raises:
      VocabularySettingError: naming the table and the setting: a
        vocabulary_size that is not an int >= 1 (>= 2 with unknown
        "unknown_row", whose last row is kept for unknown ids), more
        shards than id rows, or an automatic sketch wider than
        `MAX_SKETCH_WIDTH`.
    """
    least = 2 if self.unknown is UnknownIds.UNKNOWN_ROW else 1
    problem = Int(least).problem(vocabulary_size)
    if problem is not None:
      why = (
        ' (unknown "unknown_row" keeps the last row for unknown ids, and '
        "ids need at least one)"
        if least == 2
        else ""
      )
      raise VocabularySettingError(
        f"table {table!r}: TableConfig.vocabulary_size = {vocabulary_size!r} "
        f"with a DynamicVocabulary; use {problem}{why}."
      )
    rows = self.id_rows(vocabulary_size)
    if self.shards > rows:
      raise VocabularySettingError(
        f"table {table!r}: DynamicVocabulary.shards = {self.shards} for "
        f"{rows} id rows; each shard owns at least one row: use shards in "
        f"[1, {rows}]."
      )
    bounds = self.shard_bounds(vocabulary_size)
    widest = max(b - a for a, b in zip(bounds, bounds[1:]))  # a shard's rows
    columns = self.shard_policy().sketch_columns(widest)
    if columns > MAX_SKETCH_WIDTH:
      raise VocabularySettingError(
        f"table {table!r}: DynamicVocabulary.sketch_width = 0 (auto) makes a "
        f"sketch {columns} wide for {widest} rows; "
        f"the widest is {MAX_SKETCH_WIDTH}: give sketch_width in "
        f"[{MIN_SKETCH_WIDTH}, {MAX_SKETCH_WIDTH}]."
      )


@functools.cache
def specs() -> dict[str, Spec]:
  """Field name -> its declared range (`Int`, `Probability`, `Choice`)."""
  hints = typing.get_type_hints(DynamicVocabulary, include_extras=True)
  declared = {}
  for field in dataclasses.fields(DynamicVocabulary):
    extras = getattr(hints[field.name], "__metadata__", ())
    declared[field.name] = next(
      e for e in extras if isinstance(e, (Int, Probability, Choice))
    )
  return declared


def _refusal(setting: str, value: Any, expected: str, spec: Spec) -> str:
  note = f" ({spec.note})" if spec.note else ""
  kind = type(value).__name__
  return f"{setting} = {value!r} ({kind}); use {expected}{note}."


__all__ = [
  "DynamicVocabulary",
  "Eviction",
  "UnknownIds",
  "VocabularySettingError",
  "specs",
]
