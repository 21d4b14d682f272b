"""What `recsys` flags reach: switches bind their settings (declared with
them), `--tpu` goes to the strategy the CLI builds, not into gin."""

import os

import gin
import pytest
import tensorflow as tf

from recsys import cli, config
from recsys import train_settings as settings_lib
from recsys.cli import gin_train
from recsys.run import strategy as strategy_lib

DEFAULT = os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")
#: Each command's required flags.
REQUIRED = {
  "train": ["--gin_file", DEFAULT, "--model_dir", "runs/x"],
  "evaluate": ["--model_dir", "runs/x"],
  "export": ["--model_dir", "runs/x", "--export_dir", "runs/x/export"],
}


def _parses(argv):
  try:
    return cli.build_parser().parse_args(argv)
  except SystemExit:  # argparse: not a flag of this command
    return None


def test_every_settings_switch_is_a_flag_that_binds_its_setting(capsys):
  for flag, (name, value) in settings_lib.flag_settings().items():
    commands = []
    for command, required in REQUIRED.items():
      args = _parses([command, *required, f"--{flag}"])
      if args is None:
        continue
      commands.append(command)
      assert gin_train.bindings(args) == [f"train.{name} = {value!r}"], command
      args = _parses([command, *required])
      assert gin_train.bindings(args) == [], command
    assert commands, f"--{flag} is no flag of {sorted(REQUIRED)}"
  capsys.readouterr()  # argparse's usage lines


@pytest.fixture
def recorded(monkeypatch):
  """make_strategy and gin's call of `train` (`configured_run`), recorded
  instead of run."""
  got = {}

  def make_strategy(tpu=None, num_cpu_replicas=0, use_gpus=True):
    got["make_strategy"] = (tpu, num_cpu_replicas)
    return tf.distribute.get_strategy(), "recorded"

  def call(configurable, files, bindings, **kwargs):
    got["train.tpu bound"] = config.value("train.tpu")
    got["train"] = kwargs
    return {}

  monkeypatch.setattr(strategy_lib, "make_strategy", make_strategy)
  monkeypatch.setattr(config, "call", call)
  gin.clear_config()
  yield got
  gin.clear_config()


def test_the_tpu_flag_reaches_the_strategy_without_a_gin_binding(recorded):
  args = cli.build_parser().parse_args(
    [
      "train",
      *REQUIRED["train"],
      "--tpu",
      "grpc://10.0.0.2:8470",
      "--gin_bindings",
      "train.num_cpu_replicas = 3",
    ]
  )
  gin_train.configured(args)
  assert recorded["make_strategy"] == ("grpc://10.0.0.2:8470", 3)
  assert recorded["train.tpu bound"] is None  # never written into gin
  assert "tpu" not in recorded["train"]
  assert recorded["train"]["strategy"] is tf.distribute.get_strategy()


def test_the_configs_tpu_is_the_strategys_without_the_flag(recorded):
  args = cli.build_parser().parse_args(
    ["train", *REQUIRED["train"], "--gin_bindings", "train.tpu = 'local'"]
  )
  gin_train.configured(args)
  assert recorded["make_strategy"] == ("local", 0)


def test_a_given_strategy_is_passed_as_it_is(recorded):
  args = cli.build_parser().parse_args(["train", *REQUIRED["train"]])
  strategy = tf.distribute.get_strategy()
  gin_train.configured(args, strategy=strategy, backend="serving")
  assert "make_strategy" not in recorded
  assert recorded["train"]["strategy"] is strategy
  assert recorded["train"]["backend"] == "serving"


def test_export_restores_on_the_backend_the_registry_names(
  recorded, monkeypatch
):
  """`recsys export` names no backend: it restores on the registry's
  `for_export()`, a backend that runs here (on CPU)."""
  from backends import registry  # pylint: disable=g-import-not-at-top
  from recsys.cli import export  # pylint: disable=g-import-not-at-top

  class Stop(Exception):
    pass

  def call(configurable, files, bindings, **kwargs):
    recorded["train"] = kwargs
    raise Stop

  monkeypatch.setattr(config, "call", call)
  monkeypatch.setattr(registry, "for_export", lambda: "recorded_backend")
  args = cli.build_parser().parse_args(["export", *REQUIRED["export"]])
  monkeypatch.setattr(gin_train, "gin_files", lambda args: [DEFAULT])
  with pytest.raises(Stop):
    export.run(args)
  assert recorded["train"]["backend"] == "recorded_backend"
  assert recorded["train"]["action"] == "restore"
  monkeypatch.undo()
  name = registry.for_export()
  assert name in registry.names()
  assert (
    registry.get(name).unavailable_reason(tf.distribute.get_strategy()) is None
  )
