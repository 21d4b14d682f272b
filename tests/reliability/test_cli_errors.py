"""How `recsys` ends: exit statuses by error type, and SIGTERM at any time.

A busy model dir used to be reported as a "gin configuration error" (exit
2) because its message mentioned gin; a SIGTERM before the training loop
killed the process by the signal instead of exiting with 143.
"""

import os
import signal
import subprocess
import sys
import time

import gin
import pytest

from recsys import cli, config
from recsys.model_dir import lock as lock_lib
from tests.cli_runs import DEFAULT, ROOT, flags, tiny

TINY = tiny(
  oracle_examples=1024,
  train_steps=2,
  steps_per_loop=1,
  eval_steps=1,
  progress_bar=False,
)


def _train_args(model_dir):
  args = ["train", "--gin_file", DEFAULT, "--model_dir", str(model_dir)]
  return args + flags(TINY)


def test_a_busy_model_dir_is_its_own_error_not_a_gin_error(
  tmp_path, capsys, monkeypatch
):
  model_dir = tmp_path / "run"
  # The other run's command line (named in the message) mentions gin.
  monkeypatch.setattr(sys, "argv", ["recsys", "train", "--gin_file", "a.gin"])
  with lock_lib.ModelDirLock(str(model_dir)):
    code = cli.main(_train_args(model_dir))
  err = capsys.readouterr().err
  assert code == 1, err
  assert "ModelDirBusyError" in err and "in use by another training run" in err
  assert "gin configuration error" not in err


def test_gin_errors_raised_by_gin_still_exit_2(tmp_path, capsys):
  only_base = os.path.join(config.EXPERIMENTS_DIR, "base.gin")
  assert (
    cli.main(["train", "--gin_file", only_base, "--model_dir", str(tmp_path)])
    == 2
  )
  assert "gin configuration error" in capsys.readouterr().err
  gin.clear_config()


def _catches_sigterm(pid):
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    for line in f:
      if line.startswith("SigCgt:"):
        return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
  return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_sigterm_during_start_up_exits_143(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.Popen(
    [sys.executable, "-m", "recsys", *_train_args(tmp_path / "run")],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 120
  while proc.poll() is None and time.time() < deadline:
    if _catches_sigterm(proc.pid):  # recsys's handler is in place
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.005)
  err = proc.communicate(timeout=120)[1]
  assert proc.returncode == 143, err
  assert "SIGTERM received outside the training loop" in err


@pytest.mark.parametrize("command", ["evaluate", "export"])
@pytest.mark.parametrize(
  "statement,line",
  [
    ("import planted_module", 2),
    ("from __gin__ import dynamic_registration\nimport planted_module", 2),
    ("include 'other.gin'", 2),
  ],
)
def test_a_model_dirs_config_may_not_import_code(
  tmp_path, capsys, monkeypatch, command, statement, line
):
  marker = tmp_path / "ran.txt"
  (tmp_path / "planted_module.py").write_text(
    f"open({str(marker)!r}, 'w').write('ran')\n"
  )
  (tmp_path / "other.gin").write_text("import planted_module\n")
  monkeypatch.syspath_prepend(str(tmp_path))  # as the cwd is for `python -m`
  monkeypatch.chdir(tmp_path)
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  (model_dir / "operative_config.gin").write_text(
    f"# written by someone else\n{statement}\ntrain.train_steps = 2\n"
  )
  args = [command, "--model_dir", str(model_dir)]
  if command == "export":
    args += ["--export_dir", str(tmp_path / "export")]
  assert cli.main(args) == 1
  err = capsys.readouterr().err
  assert "UntrustedConfigError" in err
  assert f"operative_config.gin:{line}:" in err and "--gin_file" in err
  assert not marker.exists()
