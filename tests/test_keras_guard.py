"""Importing recsys makes tf.keras Keras 2, or fails clearly when too late."""

import os
import subprocess
import sys

import pytest


def _run(code: str, **env):
  full_env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  full_env.update(env, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    env=full_env,
    timeout=300,
  )


@pytest.mark.slow
def test_import_recsys_first_gives_keras_2():
  out = _run("import recsys, tensorflow as tf; print(tf.keras.__name__)")
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip().startswith("tf_keras")


@pytest.mark.slow
def test_tensorflow_imported_with_keras_3_fails_clearly():
  out = _run("import tensorflow as tf; tf.keras.layers; import backends")
  assert out.returncode != 0
  assert "KerasVersionError" in out.stderr
  assert "import recsys (or backends) before tensorflow" in out.stderr


@pytest.mark.slow
def test_explicit_opt_out_is_refused():
  out = _run("import recsys", TF_USE_LEGACY_KERAS="0")
  assert out.returncode != 0
  assert "needs Keras 2" in out.stderr
