"""recsys.features: FeatureSpecs + settings -> feature_config."""

import pytest
import tensorflow as tf

from recsys.feature_spec import FeatureSpec
from recsys.features import (
  EmbeddingSettings,
  FeatureConfigError,
  feature_config,
)

embedding = tf.tpu.experimental.embedding

SPECS = [
  FeatureSpec("user", 23),
  FeatureSpec("item", 29),
  FeatureSpec("history", 29, multi_hot=True, max_ids=5, table="item"),
  FeatureSpec("recent", 29, sequence_length=3, table="item"),
]


def test_shared_table_is_one_object_and_sequence_length_passes_through():
  config = feature_config(SPECS, EmbeddingSettings(dim=7, combiner="sqrtn"))
  assert list(config) == ["user", "item", "history", "recent"]
  assert (
    config["item"].table is config["history"].table is config["recent"].table
  )
  assert config["user"].table is not config["item"].table
  assert config["recent"].max_sequence_length == 3
  assert config["user"].max_sequence_length == 0
  item = config["item"].table
  assert (item.name, item.vocabulary_size, item.dim, item.combiner) == (
    "item",
    29,
    7,
    "sqrtn",
  )
  assert isinstance(config["user"], embedding.FeatureConfig)


def test_per_table_overrides():
  adam = embedding.Adam(0.01)
  config = feature_config(
    SPECS,
    EmbeddingSettings(
      dim=7,
      optimizer=embedding.SGD(0.1),
      overrides={"item": {"dim": 11, "optimizer": adam, "combiner": "sum"}},
    ),
  )
  assert config["user"].table.dim == 7
  assert isinstance(config["user"].table.optimizer, embedding.SGD)
  assert config["history"].table.dim == 11
  assert config["history"].table.optimizer is adam
  assert config["history"].table.combiner == "sum"


@pytest.mark.parametrize(
  "settings, match",
  [
    (
      EmbeddingSettings(overrides={"items": {"dim": 3}}),
      r"unknown tables \['items'\]",
    ),
    (
      EmbeddingSettings(overrides={"item": {"size": 3}}),
      r"unknown keys \['size'\]",
    ),
    # The settings of every table are declared ranges, refused when made
    # (tests/test_setting_ranges.py); a table's overrides are checked here.
    (
      EmbeddingSettings(overrides={"item": {"combiner": "max"}}),
      "table 'item': combiner must be one of",
    ),
    (
      EmbeddingSettings(overrides={"item": {"dim": 0}}),
      "table 'item': dim must be a positive int",
    ),
  ],
)
def test_bad_settings_name_the_table(settings, match):
  with pytest.raises(FeatureConfigError, match=match):
    feature_config(SPECS, settings)


def test_shared_table_with_two_vocabulary_sizes_is_refused():
  specs = [FeatureSpec("a", 23, table="t"), FeatureSpec("b", 29, table="t")]
  with pytest.raises(FeatureConfigError, match="share table 't'.*23 and 29"):
    feature_config(specs)


def test_a_capacity_override_is_for_raw_id_tables_only():
  """A table fed raw ids takes its rows from the override (its capacity);
  one whose ids are its rows refuses it: a smaller table would refuse ids
  the data delivers."""
  raw = FeatureSpec("user", 943, raw_ids=True)
  settings = EmbeddingSettings(overrides={"user": {"vocabulary_size": 600}})
  assert feature_config([raw], settings)["user"].table.vocabulary_size == 600
  with pytest.raises(FeatureConfigError, match="ids are its rows"):
    feature_config([FeatureSpec("user", 943)], settings)
  bad = EmbeddingSettings(overrides={"user": {"vocabulary_size": 0}})
  with pytest.raises(FeatureConfigError, match="positive int"):
    feature_config([raw], bad)
