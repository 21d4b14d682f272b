"""What the CLI tests share: the default experiment, few-step bindings, and
`recsys` in a child process, so each test file states only its own values."""

import os
import subprocess
import sys

import gin

from recsys import cli, config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")


def train_bindings(**train):
  """`train.NAME = VALUE` for each keyword, in the order given."""
  return [f"train.{name} = {value!r}" for name, value in train.items()]


def tiny(oracle_examples=4096, **train):
  """Bindings for a few-step run of DEFAULT: batch 64, `train_bindings`, a
  small oracle."""
  return [
    "train.global_batch_size = 64",
    *train_bindings(**train),
    f"SyntheticCTR.oracle_examples = {oracle_examples}",
  ]


def flags(bindings):
  """`--gin_bindings B` for each binding B."""
  return sum((["--gin_bindings", b] for b in bindings), [])


def train_argv(gin_file, model_dir, bindings=()):
  """`recsys train` arguments: `gin_file` (a path, or a name in
  experiments/) with `bindings`, into `model_dir`."""
  gin_file = os.path.join(config.EXPERIMENTS_DIR, gin_file)
  argv = ["train", "--gin_file", gin_file, *flags(bindings)]
  return argv + ["--model_dir", str(model_dir)]


def run_recsys(*args, timeout=300, env=None):
  """`python -m recsys ARGS` from the repo root: the finished process."""
  env = env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run(
    [sys.executable, "-m", "recsys", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def export(model_dir, export_dir):
  """`recsys export` in this process; it must succeed. Clears gin after."""
  code = cli.main(
    ["export", "--model_dir", model_dir, "--export_dir", export_dir]
  )
  gin.clear_config()
  assert code == 0


def train_and_export(gin_file, bindings, model_dir, export_dir):
  """`recsys train` (no progress bar) then `recsys export`, in this process;
  both must succeed. Clears gin after each."""
  code = cli.main([*train_argv(gin_file, model_dir, bindings), "--no_progress"])
  gin.clear_config()
  assert code == 0
  export(model_dir, export_dir)
