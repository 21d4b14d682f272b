"""User-facing errors share one RecsysError base and keep their builtins."""

import pytest

from recsys import (
  config,
  experiments_catalog,
  feature_spec,
  features,
  launch,
  planning,
  training,
)
from recsys.data import errors as data_errors
from recsys.data import movielens, user_history
from recsys.errors import RecsysError, SettingsError
from recsys.gin_config import untrusted as gin_untrusted
from recsys.model_dir import (
  atomic_dir,
  checkpoints,
  lock,
  run_configs,
  run_dir,
  run_files,
)
from recsys.models import errors as model_errors
from recsys.run import schedules, strategy
from recsys.training import signals, trainer
from tests import test_exit_status


@pytest.mark.parametrize(
  "error, builtin",
  [
    (config.GinConfigError, ValueError),
    (features.FeatureConfigError, ValueError),
    (experiments_catalog.UnknownExperimentError, FileNotFoundError),
    (planning.MemoryPlanError, ValueError),
    (planning.PlacementSettingsError, SettingsError),
    (SettingsError, ValueError),
    (schedules.ScheduleResumeError, SettingsError),
    (training.TrainerConfigError, SettingsError),
    (run_dir.ModelDirNotWritableError, PermissionError),
    (launch.LaunchError, RuntimeError),
    (atomic_dir.UnsafeReplaceError, OSError),
    (gin_untrusted.UntrustedConfigError, ValueError),
    (data_errors.DatasetNotFoundError, FileNotFoundError),
    (data_errors.DataFormatError, ValueError),
    (training.TrainerConfigError, ValueError),
    (training.EmptyEvalSetError, ValueError),
    (checkpoints.CorruptCheckpointError, RuntimeError),
    (trainer.NonFiniteLossError, FloatingPointError),
    (lock.ModelDirBusyError, RuntimeError),
    (run_configs.ChangedSettingsError, ValueError),
    (run_files.UnsafeRunFileError, OSError),
    (signals.TrainingPreempted, RuntimeError),
    (strategy.StrategyError, RuntimeError),
    (feature_spec.FeatureSpecError, ValueError),
    (model_errors.ModelConfigError, ValueError),
    (model_errors.FeatureMismatchError, ValueError),
    (model_errors.EmbeddingDimError, ValueError),
    (movielens.MovieLensConfigError, ValueError),
    (user_history.UserHistoryConfigError, ValueError),
  ],
)
def test_one_base_and_the_builtin_it_always_had(error, builtin):
  assert issubclass(error, RecsysError) and issubclass(error, builtin)


def test_errors_keep_their_messages_and_attributes():
  e = trainer.NonFiniteLossError("step 3 was NaN", step=3, last_checkpoint=None)
  assert str(e) == "step 3 was NaN" and e.step == 3
  with pytest.raises(RecsysError, match="NaN"):
    raise e


def test_every_error_class_recsys_defines_derives_from_the_base():
  """Every exception class of the package (walked once, for the exit
  statuses: `tests.test_exit_status.DEFINED`), so a new error class that
  forgets the base fails here, not in a user's `except RecsysError`."""
  defined = {
    name: error
    for name, error in test_exit_status.DEFINED.items()
    if name.startswith("recsys.") and issubclass(error, Exception)
  }
  assert len(defined) > 20, sorted(defined)  # the walk found the package
  outside = sorted(
    n for n, c in defined.items() if not issubclass(c, RecsysError)
  )
  assert not outside, f"errors not derived from RecsysError: {outside}"
