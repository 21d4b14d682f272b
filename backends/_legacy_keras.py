"""Makes `tf.keras` mean Keras 2 (tf_keras) before TensorFlow is first imported.

TensorFlow Recommenders and the TPU embedding mid-level API are written for
Keras 2. TensorFlow reads `TF_USE_LEGACY_KERAS` when `tf.keras` is first
resolved, so the variable must be set before that happens. This module is the
single place that sets it; `import backends` and `import recsys` both run it.
"""

import os
import sys

from backends.errors import BackendError

_ENV = "TF_USE_LEGACY_KERAS"


class KerasVersionError(BackendError, ImportError):
  """TensorFlow was already imported with Keras 3 as `tf.keras`."""


def ensure_legacy_keras() -> None:
  """Sets `TF_USE_LEGACY_KERAS=1`, or fails clearly if it is too late.

  Raises:
    KerasVersionError: TensorFlow was imported earlier in this process and
      `tf.keras` already resolves to Keras 3, or tf_keras is not installed.
  """
  requested = os.environ.get(_ENV, "").strip().lower()
  if requested in ("0", "false", "no"):
    raise KerasVersionError(
      f"{_ENV}={os.environ[_ENV]!r} is set, but recsys needs Keras 2 "
      f"(tf_keras) as tf.keras for TensorFlow Recommenders. Unset it or set "
      f"{_ENV}=1."
    )
  os.environ[_ENV] = "1"
  if "tensorflow" not in sys.modules:
    return
  # TensorFlow is already imported: tf.keras is resolved lazily, so it may not
  # be too late. Check what it resolves to now.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    keras_module = tf.keras.__name__
  except Exception as e:  # noqa: BLE001 - tf.keras import failed for any reason
    raise KerasVersionError(
      "tf.keras could not be imported; install tf-keras matching your "
      f"TensorFlow {tf.__version__} (pip install 'tf-keras~={tf.__version__}')."
    ) from e
  if not keras_module.startswith("tf_keras"):
    raise KerasVersionError(
      "TensorFlow was imported before recsys with Keras 3 as tf.keras "
      f"({keras_module}). recsys needs Keras 2: import recsys (or backends) "
      f"before tensorflow, or set {_ENV}=1 in the environment before "
      "starting Python."
    )
