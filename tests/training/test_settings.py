"""`TrainSettings` is the one declaration: what the Trainer, the resume
check, the CLI's switches and the tools read is derived from it, and its
checks change nothing (`recsys.data.sources.run_sources` wraps datasets,
`check` checks)."""

import dataclasses
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import config
from recsys import train_settings as settings_lib
from recsys.data.from_dataset import DatasetSource
from recsys.data.sources import SourceSettingsError, run_sources
from recsys.errors import SettingsError
from recsys.train_settings import TrainSettings
from recsys.training import TrainerConfigError
from recsys.training.controller import LoopSchedule
from recsys.training.train import configured_settings
from tests.training.sources import ArraySource

E = tf.tpu.experimental.embedding


def test_the_loops_schedule_is_the_settings_normalized():
  settings = TrainSettings(
    global_batch_size=64,
    eval_batch_size=None,
    steps_per_loop=1,
    train_steps=np.int64(5),  # a NumPy integer from a Python caller
    exclude_seen=True,
  )
  schedule = LoopSchedule.of_settings(settings)
  assert settings_lib.eval_batch_size(settings) == 64  # None: the global
  assert schedule.steps_per_loop == 1
  assert schedule.eval_every == 0
  assert schedule.train_steps == 5 and isinstance(schedule.train_steps, int)
  assert settings.exclude_seen is True
  # A float, None or a bool where an int is meant is refused when the
  # settings are made (`recsys.ranges`), no longer rounded here.
  with pytest.raises(SettingsError, match="train.train_steps must be"):
    TrainSettings(train_steps=5.0)


def test_switches_set_a_setting_to_the_opposite_of_its_default():
  switches = settings_lib.flag_settings()
  assert switches["no_progress"] == ("progress_bar", False)
  assert switches["allow_changed_settings"] == ("allow_changed_settings", True)
  for field in dataclasses.fields(TrainSettings):
    if "flag" in field.metadata:
      assert isinstance(field.default, bool), field.name


def test_configured_settings_are_the_bound_ones_evaluated():
  gin.clear_config()
  try:
    config.parse(
      [],
      [
        "STEPS = 7",
        "train.train_steps = %STEPS",
        "train.eval_steps = None",
        "train.global_batch_size = 32",
      ],
    )
    got = configured_settings()
  finally:
    gin.clear_config()
  assert (got.train_steps, got.eval_steps, got.global_batch_size) == (
    7,
    None,
    32,
  )
  assert got.seed == TrainSettings().seed  # unbound: the default
  assert settings_lib.eval_batch_size(got) == 32


def _dataset():
  features = {"f": tf.constant([1, 2, 3, 4], tf.int64)}
  return tf.data.Dataset.from_tensor_slices(
    (features, tf.constant([0.0, 1.0, 0.0, 1.0]))
  )


def test_run_sources_convert_and_check_only_checks():
  table = E.TableConfig(vocabulary_size=8, dim=2, name="t")
  settings = TrainSettings(feature_config={"f": E.FeatureConfig(table)})
  strategy = tf.distribute.get_strategy()
  dataset = _dataset()
  with pytest.raises(TrainerConfigError, match="expected a data source"):
    settings_lib.check(settings, dataset, dataset, strategy)
  source, eval_source = run_sources(dataset, None, settings.feature_config)
  assert isinstance(source, DatasetSource) and eval_source is source
  assert settings_lib.check(settings, source, eval_source, strategy) is None
  plain = ArraySource()
  assert run_sources(plain, None) == (plain, plain)
  other = ArraySource()
  assert run_sources(plain, other) == (plain, other)
  with pytest.raises(SourceSettingsError, match="needs feature_config"):
    run_sources(dataset, None)
  with pytest.raises(SourceSettingsError, match="not both"):
    run_sources(dataset, None, settings.feature_config, embedding=object())
  with pytest.raises(SourceSettingsError, match="got a ArraySource"):
    run_sources(plain, None, settings.feature_config)
  with pytest.raises(TrainerConfigError, match="global_batch_size=6"):
    settings_lib.check(
      TrainSettings(global_batch_size=6),
      plain,
      plain,
      types.SimpleNamespace(num_replicas_in_sync=4),  # as 4 replicas
    )
