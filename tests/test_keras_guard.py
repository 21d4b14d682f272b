"""Importing recsys makes tf.keras Keras 2, or fails clearly when too late."""

import os
import subprocess
import sys

import pytest


def _run(code: str, **env):
  full_env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  full_env.update({"TF_CPP_MIN_LOG_LEVEL": "3", **env})
  full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset
  return subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    env=full_env,
    timeout=300,
  )


@pytest.mark.slow
def test_import_recsys_first_gives_keras_2_and_a_quiet_tensorflow():
  """The README's scripts: `import recsys`, then TensorFlow, then its ops.
  Issue 52: 9 lines of TF's C++ start-up noise came first (a `cuInit`
  error on a CPU-only machine among them); TF's own log level stays TF's
  (its C++ logs warnings and errors), its loader its own."""
  out = _run(
    "import os, recsys, tensorflow as tf\n"
    "tf.reduce_sum(tf.transpose(tf.constant([[1, 2]], tf.int64)))\n"
    "print(tf.keras.__name__, os.environ['TF_CPP_MIN_LOG_LEVEL'],\n"
    "      type(tf.__loader__).__module__)\n",
    TF_CPP_MIN_LOG_LEVEL=None,
    TF_ENABLE_ONEDNN_OPTS=None,
  )
  assert out.returncode == 0, out.stderr
  keras, level, loader = out.stdout.split()
  assert keras.startswith("tf_keras") and level == "1"
  assert not loader.startswith("recsys")
  noise = ("absl::InitializeLog", "oneDNN custom", "cudart_stub", "cuInit")
  assert not any(n in out.stderr for n in noise), out.stderr


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
