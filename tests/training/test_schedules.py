"""schedules.bind_to_step: schedules follow the step, bound on copies."""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import config
from recsys.run import schedules

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


def _rates(schedule, steps):
  return [float(schedule(s)) for s in steps]


def test_a_resume_that_changes_the_length_keeps_the_rate_continuous():
  """Resumed at step 6 of 10, then at 12 of 30: the decay goes on from the
  rate reached (here linearly, from step 2), to its end at 2 + the length."""
  first = schedules.WarmupPolyDecay(
    1.0, decay_start_step=2, decay_steps=schedules.RunLength(10), power=1.0
  )
  now = schedules.WarmupPolyDecay(
    1.0, decay_start_step=2, decay_steps=schedules.RunLength(30), power=1.0
  )
  runs = [(0, 10), (6, 20), (12, 30)]
  resumed = now.resumed(runs)
  assert resumed is not now and now.progress_knots is None  # on a copy
  # Up to the first resume, the first run's schedule.
  np.testing.assert_allclose(
    _rates(resumed, range(7)), _rates(first, range(7)), rtol=1e-6
  )
  # 0.6 of the peak at step 6, going to 0 at 2 + 20 = 22: 0.375 at step 12,
  # where the third run goes on to 0 at 2 + 30 = 32.
  np.testing.assert_allclose(float(resumed(12)), 0.375, rtol=1e-6)
  np.testing.assert_allclose(float(resumed(22)), 0.375 / 2, rtol=1e-6)
  assert float(resumed(32)) == 0.0 and float(resumed(40)) == 0.0
  rates = _rates(resumed, range(33))
  assert all(b <= a for a, b in zip(rates, rates[1:]))
  steps = np.abs(np.diff(rates))
  assert steps.max() <= 0.1 + 1e-6  # no step falls more than the first's


def test_only_a_changed_run_length_changes_a_schedule():
  follows = schedules.WarmupPolyDecay(
    1.0, decay_steps=schedules.RunLength(10), power=1.0
  )
  assert follows.resumed([(0, 10), (4, 10)]) is follows
  assert follows.resumed([]) is follows
  fixed = schedules.WarmupPolyDecay(1.0, decay_steps=10, power=1.0)
  assert not fixed.follows_run_length
  assert fixed.resumed([(0, 5), (4, 10)]) is fixed
  assert schedules.resumed(0.1, [(0, 5), (4, 10)]) == 0.1


def test_gin_schedules_know_they_follow_the_run_length():
  ranking = os.path.join(config.EXPERIMENTS_DIR, "movielens_ranking.gin")
  config.parse([ranking], ["MOVIELENS_DIR = 'unused'"])
  table_lr = config.value("train.embedding_optimizer").learning_rate
  assert schedules.follows_run_length(table_lr)


def test_a_schedule_that_cannot_stretch_refuses_a_changed_length():
  gin.clear_config()
  config.parse(
    [],
    [
      "train.train_steps = 10",
      "train.embedding_optimizer = @embedding.SGD()",
      "embedding.SGD.learning_rate = "
      "@keras.optimizers.schedules.PolynomialDecay()",
      "keras.optimizers.schedules.PolynomialDecay.initial_learning_rate = 1.0",
      "keras.optimizers.schedules.PolynomialDecay.decay_steps = "
      "@total_train_steps()",
    ],
  )
  polynomial = config.value("train.embedding_optimizer").learning_rate
  assert schedules.follows_run_length(polynomial)
  assert schedules.resumed(polynomial, [(0, 10), (4, 10)]) is polynomial
  with pytest.raises(
    schedules.ScheduleResumeError,
    match=r"train.train_steps changed from 10 to 20 on resume, but "
    r"PolynomialDecay .* Keep train.train_steps = 10",
  ):
    schedules.resumed(polynomial, [(0, 10), (10, 20)])


def test_a_resume_after_the_decay_ended_says_the_rate_stays(caplog):
  lr = schedules.WarmupPolyDecay(
    1.0, decay_steps=schedules.RunLength(20), power=1.0, end_factor=0.1
  )
  resumed = lr.resumed([(0, 10), (10, 20)])
  assert _rates(resumed, [10, 15, 19]) == pytest.approx([0.1] * 3)
  assert "had ended its decay by step 10" in caplog.text
  assert "its 10 more steps train at the final rate 0.1" in caplog.text


def test_bound_schedules_are_resumed_in_place_before_a_step_is_traced():
  lr = schedules.WarmupPolyDecay(
    1.0, decay_steps=schedules.RunLength(20), power=1.0
  )
  step = tf.Variable(6, dtype=tf.int64)
  bound = schedules.bound_to_step(embedding.SGD(learning_rate=lr), step)
  schedules.resume_bound([bound, bound], [(0, 10), (6, 20)])
  np.testing.assert_allclose(float(bound.learning_rate()), 0.4, rtol=1e-6)
  step.assign(13)  # 0.4 -> 0 over 6..20
  np.testing.assert_allclose(float(bound.learning_rate()), 0.2, rtol=1e-6)


def test_run_lengths_of_a_model_dir(tmp_path):
  from recsys.model_dir import run_configs  # pylint: disable=g-import-not-at-top

  configs = tmp_path / "configs"
  configs.mkdir()
  (configs / "operative_config-1.gin").write_text("train.train_steps = 8\n")
  (configs / "input_files-1.json").write_text('{"step": 0, "files": {}}')
  (configs / "operative_config-2.gin").write_text(
    "STEPS = 20\ntrain.train_steps = %STEPS\n"
  )
  (configs / "input_files-2.json").write_text('{"step": 8, "files": {}}')
  (configs / "operative_config-3.gin").write_text("train.train_steps = 30\n")
  # Run 3 left no record of its first step: left out.
  assert run_configs.run_lengths(str(tmp_path)) == [(0, 8), (8, 20)]
