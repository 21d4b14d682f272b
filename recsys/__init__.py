"""recsys: gin-configured ranking and retrieval models on any embedding hardware.

Importing recsys makes `tf.keras` mean Keras 2 (tf_keras), which TensorFlow
Recommenders needs; see `recsys._keras`.
"""

from recsys import _keras  # noqa: F401  (must run before TensorFlow is imported)

__version__ = "0.1.0"
