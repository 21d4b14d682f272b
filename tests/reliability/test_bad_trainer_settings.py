"""Trainer settings of the wrong kind: refused at construction, named."""

import pytest
import tensorflow as tf

from recsys._keras import keras
from recsys.training import TrainerConfigError
from recsys.training import trainer as trainer_lib
from tests.training import test_trainer
from tests.training.sources import ArraySource


def make(tmp_path, **kwargs):
  settings = dict(
    source=ArraySource(),
    model=test_trainer.MODEL,
    embedding=test_trainer.EmbeddingSettings(dim=7),
    global_batch_size=10,
    train_steps=2,
    progress_bar=False,
    summaries=False,
  )
  settings.update(kwargs)
  return trainer_lib.Trainer(str(tmp_path), **settings)


def test_a_dense_optimizer_instance_is_refused_with_the_gin_spelling(tmp_path):
  with pytest.raises(
    TrainerConfigError,
    match=r"optimizer instance \(Adam\).*without parentheses",
  ):
    make(tmp_path, dense_optimizer=keras.optimizers.Adam())


def test_an_embedding_optimizer_as_dense_optimizer_is_refused(tmp_path):
  with pytest.raises(
    TrainerConfigError,
    match="expected a Keras optimizer class.*embedding_optimizer",
  ):
    make(tmp_path, dense_optimizer=tf.tpu.experimental.embedding.Adagrad)


def test_a_source_that_is_not_a_data_source_is_named(tmp_path):
  with pytest.raises(
    TrainerConfigError,
    match=r"train.data is 3 \(int\); expected a data source",
  ):
    make(tmp_path, source=3)


def test_unknown_backend_options_list_the_valid_ones(tmp_path):
  with pytest.raises(
    TrainerConfigError,
    match=r"\['invalid_id'\] are not options of the "
    r"'tensorcore' backend; it takes \['bag_widths', 'fused_kernels', "
    r"'invalid_ids', 'restore_only', 'rounding_seed', 'saturate_restores', "
    r"'static_shapes'\]",
  ):
    make(tmp_path, backend="tensorcore", backend_options={"invalid_id": "drop"})


def test_the_valid_settings_still_train(tmp_path):
  trainer = make(
    tmp_path,
    dense_optimizer=keras.optimizers.SGD,
    backend_options={"invalid_ids": "drop"},
  )
  assert trainer.train()["step"] == 2
