"""What `recsys` flags reach: switches bind their settings (declared with
them), `--tpu` goes to the strategy the CLI builds, not into gin."""

import os

from recsys import cli, config
from recsys.training import settings as settings_lib

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
      assert cli._bindings(args) == [f"train.{name} = {value!r}"], command
      args = _parses([command, *required])
      assert cli._bindings(args) == [], command
    assert commands, f"--{flag} is no flag of {sorted(REQUIRED)}"
  capsys.readouterr()  # argparse's usage lines
