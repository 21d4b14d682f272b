"""Every user-facing error carries its exit status: 2 settings, 1 runtime.

The status lives on the error's class (`recsys.errors`, `backends.errors`)
and `recsys.process.exits` reads it for every command, so the same bad
setting ends `recsys train`, `evaluate` and `export` alike. It was a
hand-kept list in the CLI: `MovieLensConfigError` exited 1 while
`TrainerConfigError` exited 2.
"""

import importlib
import inspect
import os
import pkgutil

import gin
import pytest

import backends
import recsys
from backends.errors import BackendError, BackendSettingsError
from recsys import cli, config
from recsys.errors import RecsysError, SettingsError
from recsys.process import exits

#: The settings errors: a setting (flag, gin binding, gin file) asks for what
#: cannot be. Decided here, by reading each class's raise sites.
SETTINGS = {
  "recsys.data.sources.SourceSettingsError",
  "backends.base.BackendUnavailableError",
  "backends.base.UnsupportedConfigError",
  "backends.errors.BackendSettingsError",
  "backends.layout.LayoutSettingError",
  "backends.registry.UnknownBackendError",
  "backends.registry.UnknownBackendOptionError",
  "backends.vocabulary.policy.VocabularySettingError",
  "recsys.cli_checks.GinFileNotFoundError",
  "recsys.cli_checks.TopKForRankingError",
  "recsys.config.GinConfigError",
  "recsys.config.RefusedArgumentsError",
  "recsys.gin_config.precheck.UnknownGinNameError",
  "recsys.gin_config.unread.UnreadGinBindingError",
  "recsys.ranges.SettingRangeError",
  "recsys.data.criteo.CriteoConfigError",
  "recsys.data.ials_batches.HistoryChunkError",
  "recsys.data.ials_dataset.PipelinesError",
  "recsys.data.ials_source.ImplicitALSDataError",
  "recsys.data.movielens.source.MovieLensConfigError",
  "recsys.data.pipeline.InvalidBatchSizeError",
  "recsys.data.synthetic_ctr.SyntheticConfigError",
  "recsys.data.synthetic_retrieval.SyntheticRetrievalConfigError",
  "recsys.data.user_history.UserHistoryConfigError",
  "recsys.errors.SettingsError",
  "recsys.experiments_catalog.UnknownExperimentError",
  "recsys.serving.export.ExportConfigError",
  "recsys.feature_spec.FeatureSpecError",
  "recsys.features.FeatureConfigError",
  "recsys.launch.LaunchError",
  "recsys.layers.keras_optimizers.OptimizerTranslationError",
  "recsys.layers.loss_scaling.LossScalingError",
  "recsys.models.errors.EmbeddingDimError",
  "recsys.models.errors.FeatureMismatchError",
  "recsys.models.errors.ModelConfigError",
  "recsys.planning.PlacementSettingsError",
  "recsys.train_settings.TrainerConfigError",
  "recsys.run.schedules.ScheduleResumeError",
}

#: The runtime errors: the data, the model dir, the host, a step that
#: failed; the settings themselves are valid.
RUNTIME = {
  "backends.table_plan.PlanAnswerError",
  "recsys.tools.checkout_harness.HarnessNotFoundError",
  "backends._legacy_keras.KerasVersionError",
  "backends.base.GradientDtypeError",
  "backends.base.GradientShapeError",
  "backends.base.UnsupportedInputError",  # the ids fed in, not a setting
  "backends.checkpoint.CheckpointMismatchError",
  "backends.conformance.ConformanceError",
  "backends.errors.BackendError",
  "backends.input_checks.InvalidInputError",
  # A plain TF save of an index whose shards other processes hold.
  "backends.vocabulary.sharded.ShardedIndexError",
  "backends.tensorcore.kernels.KernelBuildError",
  # The checkpoint holds values beyond the table's dtype (saturate_restores).
  "backends.storage.narrow.NarrowRangeError",
  "backends.pending.UnappliedGradientsError",
  "backends.static_bags.StaticShapeError",
  "backends.vocabulary.index.VocabularyIdsError",  # the ids fed in
  "backends.storage.exchange.ExchangeOverflowError",
  "backends.mid_level.tpu_embedding.TablesOnDeviceError",
  "recsys.cli_checks.ModelDirNotFoundError",
  "recsys.data.errors.DataFormatError",
  "recsys.data.ials_batches.IALSBatchError",
  "recsys.data.errors.DatasetNotFoundError",
  "recsys.data.errors.EmptyEvalSetError",
  "recsys.errors.RecsysError",
  "recsys.layers.embedding.EmbeddingCalledTwiceError",
  "recsys.planning.MemoryPlanError",  # this host's memory
  "recsys.model_dir.atomic_dir.UnsafeReplaceError",
  "recsys.model_dir.checkpoints.CorruptCheckpointError",
  # The run in the model dir trained with other settings or files: each
  # setting is valid, the run is why (--allow_changed_settings).
  "recsys.model_dir.run_configs.ChangedSettingsError",
  "recsys.model_dir.lock.ModelDirBusyError",
  "recsys.model_dir.run_dir.ModelDirNotWritableError",
  "recsys.model_dir.run_files.UnsafeRunFileError",
  "recsys.tools.tpu_smoke.TPUUnreachableError",
  "recsys.run.strategy.StrategyError",
  "recsys.training.trainer.NonFiniteLossError",
  "recsys.gin_config.untrusted.UntrustedConfigError",
}

#: Stops on a signal after a checkpoint: the shell's status for it.
STOPS = {"recsys.training.signals.TrainingPreempted": 143}


def _defined_exceptions():
  """{dotted name: class} of every exception class defined in recsys/ and
  backends/ (every module imported; `__main__` aside, which runs)."""
  found = {}
  for package in (recsys, backends):
    prefix = package.__name__ + "."
    for info in pkgutil.walk_packages(package.__path__, prefix):
      if info.name.endswith("__main__"):
        continue
      module = importlib.import_module(info.name)
      for name, value in vars(module).items():
        if (
          inspect.isclass(value)
          and issubclass(value, BaseException)
          and value.__module__ == info.name
        ):
          found[f"{info.name}.{name}"] = value
  return found


DEFINED = _defined_exceptions()


def test_every_error_class_is_classified():
  """A new error class must be placed in SETTINGS or RUNTIME here."""
  assert len(DEFINED) > 50, sorted(DEFINED)  # the walk found both packages
  unclassified = sorted(set(DEFINED) - SETTINGS - RUNTIME - set(STOPS))
  assert not unclassified, f"classify as settings or runtime: {unclassified}"
  gone = sorted((SETTINGS | RUNTIME | set(STOPS)) - set(DEFINED))
  assert not gone, f"no longer defined (update the table): {gone}"


@pytest.mark.parametrize("name", sorted(DEFINED))
def test_each_error_carries_its_exit_status(name):
  error_class = DEFINED[name]
  base = RecsysError if name.startswith("recsys.") else BackendError
  assert issubclass(error_class, base), f"{name} does not derive from {base}"
  expected = STOPS.get(name, 2 if name in SETTINGS else 1)
  settings_base = SettingsError if base is RecsysError else BackendSettingsError
  assert issubclass(error_class, settings_base) == (name in SETTINGS), name
  if name not in STOPS:  # (a stop's status is its instance's signal's)
    assert error_class.exit_status == expected, name
  # What the command exits with, read the one way every command reads it.
  assert exits.exit_status(_instance(error_class)) == expected, name


def _instance(error_class):
  """An instance, made without the arguments a few classes require."""
  try:
    return error_class("a message")
  except TypeError:  # e.g. NonFiniteLossError(message, step=...)
    return error_class.__new__(error_class)


def test_a_training_run_stopped_by_ctrl_c_exits_130():
  from recsys.training import signals  # pylint: disable=g-import-not-at-top

  assert signals.TrainingPreempted(3, "ckpt-3", "SIGINT").exit_status == 130
  assert signals.TrainingPreempted(3, "ckpt-3", "SIGTERM").exit_status == 143


def test_a_stop_keeps_its_status_through_gins_re_raise():
  """gin re-raises an error from a configurable as a subclass instance that
  forwards only the attributes it lacks: the status must survive that
  (Ctrl-C in the loop exited 143 once)."""
  from recsys.training import signals  # pylint: disable=g-import-not-at-top

  @gin.configurable("stopped_by_ctrl_c")
  def stopped():
    raise signals.TrainingPreempted(3, "ckpt-3", "SIGINT")

  try:
    with pytest.raises(signals.TrainingPreempted) as e:
      config.call(stopped, [], [])
  finally:
    gin.clear_config()
  assert type(e.value) is not signals.TrainingPreempted  # gin's subclass
  assert exits.exit_status(e.value) == 130


def test_what_carries_no_status():
  """Builtins a user can meet exit 1, Ctrl-C 130; anything else is a bug
  (no status: the traceback is shown)."""
  assert exits.exit_status(ValueError("x")) == 1
  assert exits.exit_status(OSError("x")) == 1
  assert exits.exit_status(KeyboardInterrupt()) == 130
  assert exits.exit_status(KeyError("x")) is None
  assert exits.exit_status(TypeError("x")) is None


def test_a_bad_flag_exits_as_a_bad_setting(capsys):
  """argparse's own status for a flag it refuses is the settings status."""
  with pytest.raises(SystemExit) as e:
    cli.main(["experiments", "--no_such_flag"])
  assert e.value.code == SettingsError.exit_status
  assert "unrecognized arguments: --no_such_flag" in capsys.readouterr().err


DEFAULT = os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")


@pytest.mark.parametrize(
  "binding, error",
  [
    # Settings each within its declared range (those out of one are refused
    # before TF starts: tests/test_setting_refusals.py) that the data
    # source, the model or the trainer refuses.
    ("SyntheticCTR.multi_hot_sizes = (1, 2)", "SyntheticConfigError"),
    ("DLRM.bottom_mlp = (64, 8)", "EmbeddingDimError"),  # a model
    ("train.batch_slices = 2048", "TrainerConfigError"),  # the trainer
  ],
)
def test_the_same_bad_setting_gets_the_same_status_from_every_command(
  tmp_path, capsys, binding, error
):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  runs = {
    "train": [],
    "evaluate": [],
    "export": ["--export_dir", str(tmp_path / "export")],
  }
  for command, extra in runs.items():
    args = [command, "--gin_file", DEFAULT, "--model_dir", str(model_dir)]
    try:
      code = cli.main([*args, *extra, "--gin_bindings", binding])
    finally:
      gin.clear_config()
    err = capsys.readouterr().err
    assert code == 2, (command, err)
    assert f"recsys {command}: {error}: " in err, (command, err)
  assert not (model_dir / "checkpoints").exists()
  assert not (tmp_path / "export").exists()
