"""schedules.bind_to_step: schedules follow the step, bound on copies."""

import numpy as np
import tensorflow as tf

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
