"""recsys: gin-configured ranking and retrieval models on any embedding device.

Importing recsys makes `tf.keras` mean Keras 2 (tf_keras), which TensorFlow
Recommenders needs: it sets `TF_USE_LEGACY_KERAS=1` before TensorFlow is
imported, or fails clearly if TensorFlow was already imported with Keras 3.
TensorFlow imported after it starts without its C++ start-up noise
(`recsys._tf_startup.quiet_tensorflow_import`; unless `TF_CPP_MIN_LOG_LEVEL`
is set). It does not import TensorFlow itself (import Keras from
`recsys._keras`): subpackages (`recsys.layers`, `recsys.models`, ...) are
imported on first use, so `import recsys` then `recsys.layers.Embedding`
works.
"""

import importlib

from backends import _legacy_keras
from recsys import _tf_startup

_legacy_keras.ensure_legacy_keras()
_tf_startup.quiet_tensorflow_import()

__version__ = "0.1.0"


def __getattr__(name: str):
  """`recsys.<subpackage>` imported on first use (TensorFlow with it)."""
  try:
    return importlib.import_module(f"recsys.{name}")
  except ModuleNotFoundError as e:
    if e.name != f"recsys.{name}":
      raise  # the subpackage exists but one of its imports is missing
    raise AttributeError(f"module 'recsys' has no attribute {name!r}") from None
