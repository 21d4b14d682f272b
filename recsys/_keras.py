"""The one import site for Keras: `keras` here is Keras 2 (tf_keras).

TensorFlow Recommenders needs Keras 2. `backends._legacy_keras` sets
`TF_USE_LEGACY_KERAS=1` before TensorFlow is imported (or fails clearly when
TensorFlow was already imported with Keras 3); import Keras from here.
"""

from backends import _legacy_keras

_legacy_keras.ensure_legacy_keras()

import tensorflow as tf  # noqa: E402  (Keras 2 must be chosen first)

keras = tf.keras

__all__ = ["keras", "tf"]
