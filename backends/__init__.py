"""Embedding backends behind one interface, and the choice between them.

Every backend trains the same `tf.tpu.experimental.embedding` configuration
(`TableConfig`, `FeatureConfig`, optimizer classes) with the same TPU optimizer
math and the same checkpoint layout, on different hardware:

  tensorcore        replicated tables, lookups on the compute cores (any device)
  tpu_embedding     TF's TPUEmbedding (embedding_feature V1) / TPUEmbeddingV2 (V2)
  tpu_embedding_v0  TF's own TPUEmbeddingV0
  sharded           tables row-sharded over parameter servers
  serving           TF's TPUEmbeddingForServing (lookup only, CPU inference)

Example:
  >>> import backends, tensorflow as tf
  >>> table = tf.tpu.experimental.embedding.TableConfig(100, 8, name="t")
  >>> features = {"f": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> emb = backends.create(features, tf.tpu.experimental.embedding.SGD(0.1))
  >>> emb.build()
"""

from backends import _legacy_keras

_legacy_keras.ensure_legacy_keras()

# pylint: disable=g-import-not-at-top,wrong-import-position
from backends.base import Capabilities, EmbeddingBackend, BackendUnavailableError
from backends.registry import (UnknownBackendError, available, create, get,
                               names, select)


def __getattr__(name):
  # Lazy, so `import backends` stays light and backends import independently.
  if name == "TensorCoreEmbedding":
    from backends.tensorcore import TensorCoreEmbedding
    return TensorCoreEmbedding
  raise AttributeError(f"module 'backends' has no attribute {name!r}")

__all__ = [
    "BackendUnavailableError",
    "Capabilities",
    "EmbeddingBackend",
    "TensorCoreEmbedding",
    "UnknownBackendError",
    "available",
    "create",
    "get",
    "names",
    "select",
]
