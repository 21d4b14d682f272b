"""Embedding backends behind one interface, and the choice between them.

Every backend trains the same `tf.tpu.experimental.embedding` configuration
(`TableConfig`, `FeatureConfig`, optimizer classes) with the same TPU optimizer
math and the same checkpoint layout, on different hardware:

  tensorcore        tables replicated or row-sharded over the replicas, lookups
                    on the compute cores (any device)
  tpu_embedding     TF's TPUEmbedding (embedding_feature V1) or
                    TPUEmbeddingV2 (V2)
  tpu_embedding_v0  TF's own TPUEmbeddingV0
  parameter_servers tables split over parameter servers (old name:
                    `sharded`, still accepted with a warning)
  serving           TF's TPUEmbeddingForServing (lookup only, CPU inference)

Example:
  >>> import backends, tensorflow as tf
  >>> table = tf.tpu.experimental.embedding.TableConfig(100, 8, name="t")
  >>> features = {"f": tf.tpu.experimental.embedding.FeatureConfig(table)}
  >>> emb = backends.create(features, tf.tpu.experimental.embedding.SGD(0.1))
  >>> emb.build()
"""

import importlib

from backends import _legacy_keras

_legacy_keras.ensure_legacy_keras()

# Public names, imported on first use so that `import backends` (and
# `import recsys`) do not import TensorFlow: a command can still set
# TF_CPP_MIN_LOG_LEVEL and thread settings first.
_EXPORTS = {
  "BackendUnavailableError": "backends.base",
  "Capabilities": "backends.base",
  "EmbeddingBackend": "backends.base",
  "GradientShapeError": "backends.base",
  "UnappliedGradientsError": "backends.pending",
  "UnknownBackendError": "backends.registry",
  "available": "backends.registry",
  "create": "backends.registry",
  "get": "backends.registry",
  "names": "backends.registry",
  "select": "backends.registry",
  "TensorCoreEmbedding": "backends.tensorcore.backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  try:  # a submodule, e.g. backends.registry
    return importlib.import_module(f"backends.{name}")
  except ModuleNotFoundError:
    raise AttributeError(
      f"module 'backends' has no attribute {name!r}"
    ) from None
