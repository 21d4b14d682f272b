"""recsys.config: registered TF/Keras names, gin errors that name the file."""

import pytest
import tensorflow as tf

from recsys import config
from recsys.gin_config import compat as gin_compat

embedding = tf.tpu.experimental.embedding


def configured_settings():
  """`train.embedding` evaluated as gin would when calling `train`."""
  return config.value("train.embedding")


def test_tpu_embedding_and_keras_classes_are_configurable(tmp_path):
  path = tmp_path / "x.gin"
  path.write_text(
    "train.embedding = @EmbeddingSettings()\n"
    "EmbeddingSettings.optimizer = @embedding.FTRL()\n"
    "embedding.FTRL.learning_rate = 0.2\n"
    "EmbeddingSettings.initializer = @keras.initializers.TruncatedNormal()\n"
    "keras.initializers.TruncatedNormal.stddev = 0.01\n"
  )
  config.parse([str(path)])
  settings = configured_settings()
  assert (
    type(settings.optimizer) is embedding.FTRL
  )  # the real class, not a gin subclass
  assert settings.optimizer.learning_rate == 0.2
  assert isinstance(settings.initializer, tf.keras.initializers.TruncatedNormal)
  for name in (
    "embedding.TableConfig",
    "embedding.FeatureConfig",
    "embedding.SGD",
    "embedding.Adagrad",
    "embedding.AdagradMomentum",
    "embedding.Adam",
    "keras.optimizers.Adam",
    "keras.optimizers.schedules.PolynomialDecay",
    "keras.losses.BinaryCrossentropy",
    "train",
    "EmbeddingSettings",
  ):
    assert gin_compat.find_configurable(name) is not None, name


def test_unknown_parameter_names_file_and_line(tmp_path):
  path = tmp_path / "bad.gin"
  path.write_text(
    "EmbeddingSettings.dim = 8\nEmbeddingSettings.dimension = 8\n"
  )
  with pytest.raises(config.GinConfigError) as e:
    config.parse([str(path)])
  assert "dimension" in str(e.value) and str(path) in str(e.value)
  assert "line 2" in str(e.value)


def test_unbound_required_macro_names_the_file(tmp_path):
  path = tmp_path / "needs.gin"
  path.write_text("DATA_DIR = %gin.REQUIRED\nEmbeddingSettings.dim = 8\n")
  with pytest.raises(config.GinConfigError) as e:
    config.parse([str(path)])
  message = str(e.value)
  assert "DATA_DIR" in message and f"{path}:1" in message
  config.parse([str(path)], ["DATA_DIR = '/tmp'"])  # bound: fine


def test_missing_file_is_a_clear_error(tmp_path):
  with pytest.raises(config.GinConfigError, match="does not exist"):
    config.parse([str(tmp_path / "nope.gin")])


def test_include_relative_to_including_file(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "inner.gin").write_text("EmbeddingSettings.dim = 5\n")
  outer = tmp_path / "sub" / "outer.gin"
  outer.write_text(
    "include 'inner.gin'\ntrain.embedding = @EmbeddingSettings()\n"
  )
  config.parse([str(outer)])
  assert configured_settings().dim == 5
