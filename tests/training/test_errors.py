"""User-facing errors share one RecsysError base and keep their builtins."""

import pytest

from recsys import (
  atomic_dir,
  config,
  experiments_catalog,
  features,
  launch,
  planning,
  untrusted_config,
)
from recsys.data import errors as data_errors
from recsys.errors import RecsysError
from recsys.training import (
  lock,
  run_configs,
  run_files,
  signals,
  strategy,
  trainer,
)


@pytest.mark.parametrize(
  "error, builtin",
  [
    (config.GinConfigError, ValueError),
    (features.FeatureConfigError, ValueError),
    (experiments_catalog.UnknownExperimentError, FileNotFoundError),
    (planning.MemoryPlanError, ValueError),
    (launch.LaunchError, RuntimeError),
    (atomic_dir.UnsafeReplaceError, OSError),
    (untrusted_config.UntrustedConfigError, ValueError),
    (data_errors.DatasetNotFoundError, FileNotFoundError),
    (data_errors.DataFormatError, ValueError),
    (trainer.TrainerConfigError, ValueError),
    (trainer.EmptyEvalSetError, ValueError),
    (trainer.CorruptCheckpointError, RuntimeError),
    (trainer.NonFiniteLossError, FloatingPointError),
    (lock.ModelDirBusyError, RuntimeError),
    (run_configs.ChangedSettingsError, ValueError),
    (run_files.UnsafeRunFileError, OSError),
    (signals.TrainingPreempted, RuntimeError),
    (strategy.StrategyError, RuntimeError),
  ],
)
def test_one_base_and_the_builtin_it_always_had(error, builtin):
  assert issubclass(error, RecsysError) and issubclass(error, builtin)


def test_errors_keep_their_messages_and_attributes():
  e = trainer.NonFiniteLossError("step 3 was NaN", step=3, last_checkpoint=None)
  assert str(e) == "step 3 was NaN" and e.step == 3
  with pytest.raises(RecsysError, match="NaN"):
    raise e
