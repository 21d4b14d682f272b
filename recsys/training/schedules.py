"""Learning-rate schedules: MLPerf DLRM's warm-up + decay, and their binding.

In gin, a schedule that should end with the run takes its length from
`train.train_steps` itself, so that `--gin_bindings 'train.train_steps =
300'` shortens the decay too:

  embedding_lr/WarmupPolyDecay.decay_steps = @total_train_steps()

`tf.tpu.experimental.embedding` optimizers take a float or a zero-argument
callable as learning rate; a Keras `LearningRateSchedule` from gin (e.g.
`embedding.Adam.learning_rate = @WarmupPolyDecay()`) is bound to the run's
step by `bind_to_step`, on copies: the caller's optimizers and tables are
left as they were given.

Example:
  >>> lr = WarmupPolyDecay(24.0, warmup_steps=2750, decay_start_step=49315,
  ...                      decay_steps=27772, power=2.0)
  >>> float(lr(0)), float(lr(2750))
"""

import copy
from collections.abc import Mapping
from typing import Any

import gin

from recsys._keras import keras, tf


@gin.register
class WarmupPolyDecay(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warm-up, constant, then polynomial decay (MLPerf DLRM's schedule).

  lr(step) = base * (step+1) / warmup                     for step < warmup
           = base                                         until decay_start
           = base * (1 - (step - start) / decay_steps)^power, floored at
             base * end_factor, afterwards.

  Args:
    base_learning_rate: the peak learning rate.
    warmup_steps: linear warm-up steps (0: none).
    decay_start_step: first step of the decay.
    decay_steps: steps over which the rate decays (0: no decay).
    power: exponent of the polynomial decay.
    end_factor: final rate as a fraction of the peak.
  """

  def __init__(
    self,
    base_learning_rate: float,
    warmup_steps: int = 0,
    decay_start_step: int = 0,
    decay_steps: int = 0,
    power: float = 2.0,
    end_factor: float = 0.0,
  ):
    super().__init__()
    if decay_steps and decay_start_step < warmup_steps:
      raise ValueError(
        f"WarmupPolyDecay: decay_start_step={decay_start_step} must be >= "
        f"warmup_steps={warmup_steps}."
      )
    self.base_learning_rate = float(base_learning_rate)
    self.warmup_steps = int(warmup_steps)
    self.decay_start_step = int(decay_start_step)
    self.decay_steps = int(decay_steps)
    self.power = float(power)
    self.end_factor = float(end_factor)

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    base = tf.constant(self.base_learning_rate, tf.float32)
    lr = base
    if self.warmup_steps:
      lr = tf.where(
        step < self.warmup_steps, base * (step + 1.0) / self.warmup_steps, lr
      )
    if self.decay_steps:
      progress = tf.clip_by_value(
        (step - self.decay_start_step) / self.decay_steps, 0.0, 1.0
      )
      decayed = base * tf.maximum(
        (1.0 - progress) ** self.power, self.end_factor
      )
      lr = tf.where(step >= self.decay_start_step, decayed, lr)
    return lr

  def get_config(self):
    return {
      "base_learning_rate": self.base_learning_rate,
      "warmup_steps": self.warmup_steps,
      "decay_start_step": self.decay_start_step,
      "decay_steps": self.decay_steps,
      "power": self.power,
      "end_factor": self.end_factor,
    }


@gin.register
def total_train_steps() -> int:
  """`train.train_steps` of the parsed gin config (its default if unbound).

  For schedules in gin (`decay_steps = @total_train_steps()`): gin calls it
  when it builds the schedule, after every file and `--gin_bindings` is
  parsed, so the schedule follows the run's length. A resumed run with more
  steps stretches its remaining decay accordingly.
  """
  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.train_settings import TrainSettings  # pylint: disable=g-import-not-at-top

  steps = config.value("train.train_steps")
  return int(TrainSettings().train_steps if steps is None else steps)


def bound_to_step(optimizer: Any, step: tf.Variable) -> Any:
  """`optimizer`, or a copy whose schedule learning rate reads `step`.

  Args:
    optimizer: a `tf.tpu.experimental.embedding` optimizer (or None).
    step: the run's global step variable.

  Returns:
    `optimizer` itself unless its learning rate is a Keras
    `LearningRateSchedule`; then a shallow copy with
    `learning_rate = lambda: schedule(step)`. `optimizer` is not changed.
  """
  lr = getattr(optimizer, "learning_rate", None)
  if not isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
    return optimizer
  bound = copy.copy(optimizer)
  bound.learning_rate = lambda: lr(step)
  return bound


def bind_to_step(
  optimizer: Any, feature_config: Mapping[str, Any], step: tf.Variable
) -> tuple[Any, dict[str, Any]]:
  """Binds the schedules of a run's embedding optimizers to `step`.

  Args:
    optimizer: the default embedding optimizer.
    feature_config: feature name -> `FeatureConfig`; a table's own
      optimizer (`TableConfig.optimizer`) may carry a schedule too.
    step: the run's global step variable.

  Returns:
    `(optimizer, feature_config)` with schedule-driven optimizers replaced by
    bound copies (`bound_to_step`), and the tables (and features) that use
    them copied to point at the copies. An optimizer or table shared by
    several tables or features stays shared; nothing given is changed.
  """
  optimizers: dict[int, Any] = {}
  tables: dict[int, Any] = {}

  def bind(opt: Any) -> Any:
    if id(opt) not in optimizers:
      optimizers[id(opt)] = bound_to_step(opt, step)
    return optimizers[id(opt)]

  def table_of(table: Any) -> Any:
    if id(table) not in tables:
      opt = bind(table.optimizer)
      if opt is table.optimizer:
        tables[id(table)] = table
      else:
        tables[id(table)] = copy.copy(table)
        tables[id(table)].optimizer = opt
    return tables[id(table)]

  bound_features = {}
  for name, feature in feature_config.items():
    table = table_of(feature.table)
    if table is not feature.table:
      feature = copy.copy(feature)
      feature.table = table
    bound_features[name] = feature
  return bind(optimizer), bound_features
