"""One table's layout: where its rows live, how they are ordered, exchanged
and stored, as one record (`TableLayout`), and the one parser of a setting
given "one value, or table name -> value" (`per_table`).

The planner (`recsys.planning`, a backend's `plan_tables`) answers with one
`TableLayout` per table, a backend that places its tables is built from
those (`layouts=`), and every backend reports what it holds
(`EmbeddingBackend.layouts()`), so the plan and the built tables are one
record. The enums are strings (`Placement.ROW_SHARDED == "row_sharded"`),
so gin files and dicts that spell the values keep working.

Example:
  >>> per_table({"C10": "row_sharded"}, "EmbeddingPlacement.tables",
  ...           ["C1", "C10"], Placement.requestable())
  {'C10': <Placement.ROW_SHARDED: 'row_sharded'>}
  >>> TableLayout(Placement.ROW_SHARDED).exchange
  <Exchange.ALL_TO_ALL: 'all_to_all'>
"""

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from backends import placement as placement_lib
from backends.errors import BackendSettingsError
from backends.suggest import did_you_mean


class LayoutSettingError(BackendSettingsError, ValueError):
  """A per-table setting that cannot be: an unknown value or table name,
  or neither one value nor a dict table name -> value."""


class StrEnum(str, enum.Enum):
  """A string-valued enum that prints as its value (`str(Placement.
  ROW_SHARDED) == "row_sharded"`), as Python 3.11's `enum.StrEnum` does."""

  def __str__(self) -> str:
    return self.value


class Placement(StrEnum):
  """Where a table's rows live."""

  #: A full copy of the rows and slots on every replica.
  REPLICATED = placement_lib.REPLICATED
  #: Each replica owns `ceil(V / R)` rows and their slots.
  ROW_SHARDED = placement_lib.ROW_SHARDED
  #: On the parameter servers of a `ParameterServerStrategy` (whole on one,
  #: or split over several by the strategy's partitioner).
  PARAMETER_SERVERS = "parameter_servers"
  #: Split over the TPU cores by TF's embedding engine.
  TPU_CORES = "tpu_cores"

  @classmethod
  def requestable(cls) -> tuple["Placement", ...]:
    """What a user may ask for (`EmbeddingPlacement.tables`)."""
    return (cls.REPLICATED, cls.ROW_SHARDED)


class RowLayout(StrEnum):
  """Which rows a replica owns of a row-sharded table."""

  #: Equal row ranges (initialized and checkpointed by row slices).
  CONTIGUOUS = "contiguous"
  #: Ids `r, r + R, ...` (saved whole).
  STRIDED = "strided"


class Exchange(StrEnum):
  """How a row-sharded table's replicas exchange ids, rows, gradients."""

  ALL_TO_ALL = placement_lib.ALL_TO_ALL
  ALL_GATHER = placement_lib.ALL_GATHER
  #: A request only: the planner picks the one moving fewer bytes.
  AUTO = "auto"

  @classmethod
  def built(cls) -> tuple["Exchange", ...]:
    """What a built table may have (not "auto")."""
    return (cls.ALL_TO_ALL, cls.ALL_GATHER)


class StorageDtype(StrEnum):
  """The dtype a table's rows are stored in (slots stay float32)."""

  FLOAT32 = "float32"
  BFLOAT16 = "bfloat16"
  FLOAT16 = "float16"


E = TypeVar("E", bound=enum.Enum)


@dataclasses.dataclass(frozen=True)
class TableLayout:
  """Where one table's rows live and how, as a backend holds them.

  Attributes:
    placement: where the rows live.
    dtype: the rows' storage dtype (a TPU backend's table may hold another
      `TableConfig.dtype`, kept as its name).
    row_layout: which rows a replica owns (row-sharded tables; None
      otherwise).
    exchange: how the replicas exchange a row-sharded table's ids, rows
      and gradients (None otherwise).
    exchange_sigmas: the all-to-all's margin per owner, in standard
      deviations of a uniform spread (row-sharded tables; None otherwise).
    vocabulary: how raw ids reach the rows: a dynamic vocabulary
      (`backends.vocabulary.DynamicVocabulary`: an index with admission and
      eviction) or hashing (`HashedIds`); None: the ids are the rows.

  Values may be given as their strings; a row-sharded layout's unset
  fields take their defaults and the others' are None, so two layouts of
  the same tables compare equal however they were spelt.
  """

  placement: Placement = Placement.REPLICATED
  dtype: StorageDtype | str = StorageDtype.FLOAT32
  row_layout: RowLayout | None = None
  exchange: Exchange | None = None
  exchange_sigmas: float | None = None
  vocabulary: Any = None

  def __post_init__(self) -> None:
    put = object.__setattr__
    # A vocabulary policy (`backends.vocabulary.POLICIES`, which import
    # this module) is known by what it does: it checks itself per table.
    if self.vocabulary is not None and not callable(
      getattr(self.vocabulary, "check", None)
    ):
      raise LayoutSettingError(
        f"vocabulary = {self.vocabulary!r}; give a backends.vocabulary."
        "DynamicVocabulary or HashedIds (or None: the ids are the rows)."
      )
    put(self, "placement", value_of(self.placement, Placement, "placement"))
    dtype = str(getattr(self.dtype, "value", self.dtype))
    put(self, "dtype", _maybe(StorageDtype, dtype))
    if self.placement is not Placement.ROW_SHARDED:
      for field in ("row_layout", "exchange", "exchange_sigmas"):
        put(self, field, None)
      return
    put(
      self,
      "row_layout",
      value_of(
        self.row_layout or RowLayout.CONTIGUOUS, RowLayout, "row_layout"
      ),
    )
    put(
      self,
      "exchange",
      value_of(
        self.exchange or Exchange.ALL_TO_ALL,
        Exchange,
        "exchange",
        Exchange.built(),
      ),
    )
    sigmas = self.exchange_sigmas
    if sigmas is None:
      sigmas = placement_lib.CAPACITY_SIGMAS
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)):
      sigmas = float("nan")
    if not sigmas > 0:
      raise LayoutSettingError(
        f"exchange_sigmas = {self.exchange_sigmas!r}; use a number > 0 (the "
        "all-to-all's margin over each owner's share, in standard "
        f"deviations; default {placement_lib.CAPACITY_SIGMAS})."
      )
    put(self, "exchange_sigmas", float(sigmas))

  @property
  def row_sharded(self) -> bool:
    return self.placement is Placement.ROW_SHARDED

  @property
  def dynamic(self) -> bool:
    """Whether raw ids reach the rows through a dynamic vocabulary."""
    return self.vocabulary is not None


def _maybe(kind: type[E], value: str) -> E | str:
  """`kind(value)` when it is one, else `value` as it is."""
  try:
    return kind(value)
  except ValueError:
    return value


def value_of(
  value: Any,
  kind: type[E],
  setting: str,
  allowed: Iterable[E] | None = None,
) -> E:
  """`value` (an enum member or its string) as a member of `kind`.

  Raises:
    LayoutSettingError: naming `setting`, the valid values and the
      closest one.
  """
  choices = list(kind if allowed is None else allowed)
  for choice in choices:
    if value is choice or (isinstance(value, str) and value == choice.value):
      return choice
  spelt = [str(c.value) for c in choices]
  hint = did_you_mean(value, spelt) if isinstance(value, str) else ""
  given = value.value if isinstance(value, enum.Enum) else value  # as spelt
  raise LayoutSettingError(
    f"{setting} = {given!r}; use one of {', '.join(map(repr, spelt))}.{hint}"
  )


def per_table(
  value: Any,
  setting: str,
  names: Sequence[str] | None,
  allowed: Iterable[E],
  others: E | None = None,
) -> dict[str, E]:
  """Table name -> value of a setting given once or per table.

  Args:
    value: one value for every table, or a dict table name -> value.
    setting: the setting's name, for the errors (e.g.
      "EmbeddingPlacement.tables").
    names: the tables; None: only the values are checked (a backend that
      ignores the setting), and {} is returned.
    allowed: the valid values (members of one string-valued enum).
    others: what a dict means for the tables it leaves out (None: they are
      left out of the answer too).

  Returns:
    Table name -> member, for every table in `names` (a dict without
    `others`: the tables it names).

  Raises:
    LayoutSettingError: naming `setting` (and the table): a value that is
      not one of `allowed`, an unknown table (with the closest names), or
      neither a value nor a dict.
  """
  choices = list(allowed)
  kind = type(choices[0])
  if isinstance(value, (str, enum.Enum)):
    one = value_of(value, kind, setting, choices)
    return {name: one for name in names or ()}
  if not isinstance(value, Mapping):
    raise LayoutSettingError(
      f"{setting} = {value!r}; give one of "
      f"{', '.join(repr(c.value) for c in choices)} for every table, or a "
      "dict table name -> one of them."
    )
  given = {
    table: value_of(v, kind, f"{setting}[{table!r}]", choices)
    for table, v in value.items()
  }
  if names is None:
    return {}
  refuse_unknown_tables(given, names, setting)
  if others is None:
    return given
  return {name: given.get(name, others) for name in names}


def refuse_unknown_tables(
  given: Iterable[Any], names: Sequence[str], setting: str
) -> None:
  """Raises when `given` names a table not in `names`.

  Raises:
    LayoutSettingError: naming `setting`, the unknown tables, the tables
      there are and the closest names.
  """
  unknown = [t for t in given if t not in names]
  if unknown:
    hints = "".join(
      did_you_mean(str(t), [str(n) for n in names]) for t in unknown
    )
    raise LayoutSettingError(
      f"{setting} names unknown tables {sorted(map(str, unknown))}; the "
      f"tables are {sorted(names)}.{hints}"
    )


def every_table(
  names: Iterable[str], layout: "TableLayout | Mapping[str, TableLayout]"
) -> dict[str, TableLayout]:
  """Table name -> layout from one layout for every table, or a dict
  (tables it leaves out replicated float32).

  Raises:
    LayoutSettingError: a dict naming unknown tables, or a value that is
      no `TableLayout`.
  """
  names = list(names)
  if isinstance(layout, TableLayout):
    return {name: layout for name in names}
  if not isinstance(layout, Mapping):
    raise LayoutSettingError(
      f"layouts = {layout!r}; give a backends.layout.TableLayout for every "
      "table, or a dict table name -> TableLayout."
    )
  refuse_unknown_tables(layout, names, "layouts")
  out = {}
  for name in names:
    got = layout.get(name, TableLayout())
    if not isinstance(got, TableLayout):
      raise LayoutSettingError(
        f"layouts[{name!r}] = {got!r}; give a backends.layout.TableLayout."
      )
    out[name] = got
  return out


def vocabularies(
  names: Iterable[str],
  layout: "TableLayout | Mapping[str, TableLayout] | None",
) -> dict[str, Any]:
  """Table name -> its layout's vocabulary, for the tables given one: what
  a backend that places its tables itself reads of the planned layouts
  (`every_table`'s refusals apply)."""
  return {
    name: held.vocabulary
    for name, held in every_table(names, layout or {}).items()
    if held.vocabulary is not None
  }


__all__ = [
  "Exchange",
  "LayoutSettingError",
  "Placement",
  "RowLayout",
  "StorageDtype",
  "TableLayout",
  "every_table",
  "vocabularies",
  "per_table",
  "refuse_unknown_tables",
  "value_of",
]
