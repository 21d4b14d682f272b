"""TF's own `TPUEmbeddingV0` on CPU, for the tpu_embedding_v0 backend's
tests: its one TPU dependency, the check that it is made under a
TPUStrategy, takes any strategy (its lookups are plain gathers; its
densifying `outside_compilation` calls the function itself outside a TPU
step), as does the backend's."""

import importlib
import types

import tensorflow as tf

from backends.mid_level.tpu_embedding_v0 import TPUEmbeddingV0Backend


def allow(monkeypatch) -> type[TPUEmbeddingV0Backend]:
  """Lets TF's V0 and the backend be made under any strategy until the
  test ends (`monkeypatch`); returns the backend class."""
  tf_v0 = importlib.import_module("tensorflow.python.tpu.tpu_embedding_v1")
  any_strategy = types.SimpleNamespace(
    TPUStrategy=tf.distribute.Strategy, TPUStrategyV2=tf.distribute.Strategy
  )
  monkeypatch.setattr(tf_v0, "tpu_strategy", any_strategy)
  monkeypatch.setattr(
    TPUEmbeddingV0Backend, "unavailable_reason", classmethod(lambda c, s: None)
  )
  return TPUEmbeddingV0Backend
