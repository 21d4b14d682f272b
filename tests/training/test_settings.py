"""`TrainSettings` is the one declaration: what the Trainer, the resume
check, the CLI's switches and the tools read is derived from it."""

import dataclasses

import gin

from recsys import config
from recsys.training import Trainer
from recsys.training import settings as settings_lib
from recsys.training.settings import TrainSettings
from recsys.training.train import configured_settings


def test_the_trainer_keeps_the_settings_declared_for_it_normalized():
  declared = settings_lib.trainer_attributes(TrainSettings())
  fields = {f.name for f in dataclasses.fields(TrainSettings)}
  typed = {name for name in Trainer.__annotations__ if name in fields}
  assert typed == set(declared)  # each attribute typed for mypy
  trainer = Trainer.__new__(Trainer)  # only the attributes, nothing built
  trainer._store_settings(  # pylint: disable=protected-access
    TrainSettings(
      global_batch_size=64,
      eval_batch_size=None,
      steps_per_loop=0,
      eval_every=None,  # gin may bind None
      train_steps=5.0,
      exclude_seen=1,
    )
  )
  assert trainer.eval_batch_size == 64  # None: the global batch size
  assert trainer.steps_per_loop == 1
  assert trainer.eval_every == 0
  assert trainer.train_steps == 5 and isinstance(trainer.train_steps, int)
  assert trainer.exclude_seen is True
  for name in declared:
    assert hasattr(trainer, name), name


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
  kept = settings_lib.trainer_attributes(got)
  assert kept["eval_batch_size"] == 32
