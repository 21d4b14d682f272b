"""Which backend the layer runs on, and what it hands it (TPU paths by dispatch).

No TPU is reachable here: a fake TPUStrategy (only its hardware feature) shows
that the layer picks the backend `backends.select` picks and passes TFRS's
constructor arguments (`pipeline_execution_with_tensor_core`, `batch_size`)
to TF's TPUEmbedding as the tpu_embedding backend builds it.
"""

import pytest

from recsys import layers
from recsys._keras import tf
from tests.backends.test_selection import fake_tpu_strategy

E = tf.tpu.experimental.embedding
B = 8


def config():
  return {
    "user": E.FeatureConfig(E.TableConfig(23, 8, name="users"), name="user")
  }


@pytest.mark.parametrize(
  "feature,want",
  [
    ("V1", "tpu_embedding"),
    ("V2", "tpu_embedding"),
    ("UNSUPPORTED", "tensorcore"),
  ],
)
def test_auto_follows_the_tpu_embedding_feature(feature, want):
  layer = layers.Embedding(
    config(), E.Adagrad(0.1), batch_size=B, strategy=fake_tpu_strategy(feature)
  )
  assert layer.backend_name == want


def test_tfrs_arguments_reach_tf_tpu_embedding_on_v1():
  layer = layers.Embedding(
    config(),
    "adagrad",
    pipeline_execution_with_tensor_core=True,
    batch_size=B,
    strategy=fake_tpu_strategy("V1"),
  )
  kwargs = layer.embedding._tf_constructor_kwargs()  # pylint: disable=protected-access
  assert kwargs["pipeline_execution_with_tensor_core"] is True
  assert isinstance(kwargs["feature_config"]["user"].table.optimizer, E.Adagrad)
  # TF's own class accepts them (its CPU mode), with the batch size given.
  tf_emb = E.TPUEmbedding(**kwargs)
  tf_emb.build(per_replica_batch_size=B)
  assert sorted(t.name for t in tf_emb.embedding_tables) == ["users"]


def test_embedding_feature_unsupported_forces_tensorcore_like_tfrs():
  unsupported = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.UNSUPPORTED
  layer = layers.Embedding(
    config(),
    E.SGD(0.1),
    embedding_feature=unsupported,
    strategy=fake_tpu_strategy("V1"),
  )
  assert layer.backend_name == "tensorcore"


def test_other_embedding_feature_overrides_and_bad_optimizers_are_refused():
  v2 = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
  with pytest.raises(ValueError, match="only UNSUPPORTED"):
    layers.Embedding(config(), E.SGD(0.1), embedding_feature=v2)
  with pytest.raises(
    ValueError, match="unknown embedding optimizer name 'rmsprop'"
  ):
    layers.Embedding(config(), "rmsprop")
