"""recsys: gin-configured ranking and retrieval models on any embedding device.

Importing recsys makes `tf.keras` mean Keras 2 (tf_keras), which TensorFlow
Recommenders needs: it sets `TF_USE_LEGACY_KERAS=1` before TensorFlow is
imported, or fails clearly if TensorFlow was already imported with Keras 3.
It does not import TensorFlow itself (import Keras from `recsys._keras`).
"""

from backends import _legacy_keras

_legacy_keras.ensure_legacy_keras()

__version__ = "0.1.0"
