"""`backends.layout`: the TableLayout record and the one per-table parser."""

import dataclasses

import pytest

from backends import layout
from backends.layout import Exchange, Placement, StorageDtype, TableLayout

NAMES = ["C1", "C2", "C10"]
TABLES = "EmbeddingPlacement.tables"


def test_one_value_applies_to_every_table():
  got = layout.per_table("row_sharded", TABLES, NAMES, Placement.requestable())
  assert got == dict.fromkeys(NAMES, Placement.ROW_SHARDED)
  assert got["C1"] == "row_sharded"  # the gin string compares equal


def test_a_dict_names_its_tables_others_left_out_or_defaulted():
  given = {"C10": "row_sharded"}
  allowed = Placement.requestable()
  assert layout.per_table(given, TABLES, NAMES, allowed) == {
    "C10": Placement.ROW_SHARDED
  }
  dtypes = layout.per_table(
    {"C2": "bfloat16"},
    "EmbeddingPlacement.table_dtype",
    NAMES,
    StorageDtype,
    others=StorageDtype.FLOAT32,
  )
  assert dtypes == {"C1": "float32", "C2": "bfloat16", "C10": "float32"}


def _assert_placements_refused(placements, match):
  """`EmbeddingPlacement.tables = placements` is refused with `match`."""
  with pytest.raises(layout.LayoutSettingError, match=match):
    layout.per_table(placements, TABLES, NAMES, Placement.requestable())


def test_an_unknown_table_is_refused_with_the_closest_name():
  _assert_placements_refused(
    {"C100": "row_sharded"},
    r"EmbeddingPlacement.tables names unknown tables \['C100'\]; the "
    r"tables are \['C1', 'C10', 'C2'\]. Did you mean 'C10'\?",
  )


def test_an_unknown_value_names_the_setting_the_table_and_the_valid_ones():
  _assert_placements_refused(
    {"C10": "row_shard"},
    r"EmbeddingPlacement.tables\['C10'\] = 'row_shard'; use one of "
    r"'replicated', 'row_sharded'. Did you mean 'row_sharded'\?",
  )
  with pytest.raises(
    layout.LayoutSettingError,
    match=r"EmbeddingPlacement.exchange = 'all_gathr'; use one of "
    r"'all_to_all', 'all_gather', 'auto'. Did you mean 'all_gather'\?",
  ):
    layout.per_table(
      "all_gathr", "EmbeddingPlacement.exchange", NAMES, Exchange
    )
  # A placement a backend reports but no user requests is refused too.
  with pytest.raises(layout.LayoutSettingError, match="'parameter_servers'"):
    layout.per_table(
      "parameter_servers", TABLES, NAMES, Placement.requestable()
    )


def test_neither_a_value_nor_a_dict_is_refused():
  with pytest.raises(layout.LayoutSettingError, match=r"= \['C1'\]; give one"):
    layout.per_table(["C1"], TABLES, NAMES, Placement.requestable())


def test_without_names_only_the_values_are_checked():
  """A backend that places its tables itself: values checked, none kept."""
  allowed = Placement.requestable()
  assert layout.per_table({"nope": "replicated"}, TABLES, None, allowed) == {}
  with pytest.raises(layout.LayoutSettingError):
    layout.per_table({"nope": "sharded"}, TABLES, None, allowed)


def test_a_layout_normalizes_what_its_placement_does_not_use():
  sharded = TableLayout("row_sharded", "bfloat16")
  assert sharded == TableLayout(
    Placement.ROW_SHARDED,
    StorageDtype.BFLOAT16,
    "contiguous",
    "all_to_all",
    5.0,
  )
  assert TableLayout("replicated", row_layout="strided") == TableLayout()
  assert dataclasses.replace(sharded, placement="replicated").exchange is None
  with pytest.raises(layout.LayoutSettingError, match="exchange = 'auto'"):
    TableLayout("row_sharded", exchange="auto")  # a request, never held
  with pytest.raises(layout.LayoutSettingError, match="exchange_sigmas = 0"):
    TableLayout("row_sharded", exchange_sigmas=0)


def test_every_table_takes_one_layout_or_a_dict():
  one = TableLayout("row_sharded")
  assert layout.every_table(NAMES, one) == dict.fromkeys(NAMES, one)
  got = layout.every_table(NAMES, {"C2": one})
  assert got == {"C1": TableLayout(), "C2": one, "C10": TableLayout()}
  with pytest.raises(layout.LayoutSettingError, match="Did you mean 'C2'"):
    layout.every_table(NAMES, {"C20": one})
