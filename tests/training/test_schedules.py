"""schedules.bind_to_step: schedules follow the step, bound on copies."""

import os

import gin
import numpy as np
import tensorflow as tf

from recsys import config
from recsys.training import schedules

embedding = tf.tpu.experimental.embedding


def test_bound_on_copies_the_callers_objects_are_unchanged():
  schedule = schedules.WarmupPolyDecay(0.5, warmup_steps=4)
  default = embedding.Adam(learning_rate=schedule)
  own = embedding.Adagrad(learning_rate=schedule)
  plain = embedding.SGD(0.1)
  shared = embedding.TableConfig(23, 7, optimizer=own, name="shared")
  fixed = embedding.TableConfig(11, 7, optimizer=plain, name="fixed")
  features = {
    "a": embedding.FeatureConfig(shared, name="a"),
    "b": embedding.FeatureConfig(shared, name="b"),
    "c": embedding.FeatureConfig(fixed, name="c"),
  }
  given = dict(features)
  step = tf.Variable(1, dtype=tf.int64)

  bound, bound_features = schedules.bind_to_step(default, features, step)

  # The caller's optimizers, tables and features are as they were given.
  assert default.learning_rate is schedule and own.learning_rate is schedule
  assert features == given and shared.optimizer is own
  assert features["a"].table is shared
  # The copies follow the step and stay shared where the originals were.
  assert type(bound) is embedding.Adam and bound is not default
  table = bound_features["a"].table
  assert table is bound_features["b"].table and table is not shared
  assert type(table.optimizer) is embedding.Adagrad
  np.testing.assert_allclose(float(bound.learning_rate()), 0.5 * 2 / 4)
  step.assign(10)
  np.testing.assert_allclose(float(table.optimizer.learning_rate()), 0.5)
  # Without a schedule nothing is copied.
  assert bound_features["c"] is features["c"]
  assert schedules.bound_to_step(plain, step) is plain
  assert schedules.bound_to_step(None, step) is None


def test_gin_schedules_follow_train_steps_given_on_the_command_line():
  """The MovieLens files decay to 0 at `train.train_steps`, whatever sets it
  (issue 31: a separate TRAIN_STEPS macro left a shortened run's rate barely
  decayed)."""
  ranking = os.path.join(config.EXPERIMENTS_DIR, "movielens_ranking.gin")
  config.parse(
    [ranking], ["MOVIELENS_DIR = 'unused'", "train.train_steps = 300"]
  )
  table_lr = config.value("train.embedding_optimizer").learning_rate
  dense_lr = config.value("keras.optimizers.Adam.learning_rate")
  for lr, base in ((table_lr, 2.5), (dense_lr, 0.001)):
    np.testing.assert_allclose(float(lr(150)), base / 2, rtol=1e-6)
    assert float(lr(300)) == 0.0
  fm = os.path.join(config.EXPERIMENTS_DIR, "movielens_fm.gin")
  gin.clear_config()
  config.parse([fm], ["MOVIELENS_DIR = 'unused'"])  # the file's own length
  lr = config.value("train.embedding_optimizer").learning_rate
  assert float(lr(4499)) > 0.0 and float(lr(4500)) == 0.0
