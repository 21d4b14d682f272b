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

A resume whose `train.train_steps` differs from the previous run's keeps the
learning rate continuous (`resumed`): a `WarmupPolyDecay` that follows the
run's length goes on from the rate it had reached at the resume step and
stretches its remaining decay over the new length, instead of jumping to
where a schedule of the new length would be (a warm restart). Other
schedules built from `total_train_steps()` cannot be stretched, and such a
resume is refused (`ScheduleResumeError`).

Example:
  >>> lr = WarmupPolyDecay(24.0, warmup_steps=2750, decay_start_step=49315,
  ...                      decay_steps=27772, power=2.0)
  >>> float(lr(0)), float(lr(2750))
"""

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any

import gin

from recsys import ranges
from recsys._keras import keras, tf
from recsys.errors import SettingsError

log = logging.getLogger("recsys.training")


class ScheduleResumeError(SettingsError):
  """A resume changes the run's length under a schedule that follows it and
  cannot be stretched: its learning rate would jump at the resume step."""


class RunLength(int):
  """`train.train_steps` as `total_train_steps()` gives it: an int that
  remembers it is the run's length, so that a resume with another length
  can stretch the schedule built from it (`resumed`)."""


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

  @ranges.checked
  def __init__(
    self,
    base_learning_rate: ranges.Positive,
    warmup_steps: Annotated[int, ranges.Int(0, note="0: none")] = 0,
    decay_start_step: ranges.NonNegativeInt = 0,
    decay_steps: Annotated[int, ranges.Int(0, note="0: no decay")] = 0,
    power: ranges.NonNegative = 2.0,
    end_factor: ranges.Fraction = 0.0,
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
    #: Whether `decay_steps` is the run's length (`@total_train_steps()`).
    self.follows_run_length = isinstance(decay_steps, RunLength)
    #: The decay's progress (0 to 1) at steps where it bends, after resumes
    #: that changed the run's length (`resumed`); None: linear from
    #: `decay_start_step` to `decay_start_step + decay_steps`.
    self.progress_knots: tuple[tuple[int, float], ...] | None = None

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    base = tf.constant(self.base_learning_rate, tf.float32)
    lr = base
    if self.warmup_steps:
      lr = tf.where(
        step < self.warmup_steps, base * (step + 1.0) / self.warmup_steps, lr
      )
    if self.decay_steps:
      if self.progress_knots is None:
        progress = tf.clip_by_value(
          (step - self.decay_start_step) / self.decay_steps, 0.0, 1.0
        )
      else:
        progress = _interpolated(step, self.progress_knots)
      decayed = base * tf.maximum(
        (1.0 - progress) ** self.power, self.end_factor
      )
      lr = tf.where(step >= self.decay_start_step, decayed, lr)
    return lr

  def resumed(self, runs: Sequence[tuple[int, int]]) -> "WarmupPolyDecay":
    """This schedule as the last of `runs` continues it.

    Args:
      runs: `(first step, train.train_steps)` of each run on the model dir,
        oldest first, the resuming one last.

    Returns:
      `self` when its decay does not follow the run's length or no resume
      changed the length; else a copy whose decay goes on, at each resume
      that did, from the progress it had reached there to its end at
      `decay_start_step` + that run's length: the learning rate is
      continuous, and the remaining decay stretched (or shrunk).
    """
    if not (self.follows_run_length and self.decay_steps and runs):
      return self
    start = self.decay_start_step
    knots = [(start, 0.0), (start + runs[0][1], 1.0)]
    length = runs[0][1]
    for first, steps in runs[1:]:
      if steps == length or steps <= first:  # same decay, or no step to run
        continue
      end, length = start + steps, steps
      if first <= start:  # the decay had not begun
        knots = [(start, 0.0), (end, 1.0)]
      else:
        reached = _interpolate(first, knots)
        knots = [k for k in knots if k[0] < first] + [(first, reached)]
        knots.append((end, 1.0))
    if knots == [(start, 0.0), (start + self.decay_steps, 1.0)]:
      return self
    out = copy.copy(self)
    out.progress_knots = tuple(knots)
    first, steps = runs[-1]
    if _interpolate(first, knots) >= 1.0 and steps > first:
      log.warning(
        "the learning-rate schedule (WarmupPolyDecay) had ended its decay "
        "by step %d, where this run resumes: its %d more steps train at "
        "the final rate %g (the decay goes on, it does not restart).",
        first,
        steps - first,
        self.base_learning_rate * self.end_factor,
      )
    return out

  def get_config(self):
    return {
      "base_learning_rate": self.base_learning_rate,
      "warmup_steps": self.warmup_steps,
      "decay_start_step": self.decay_start_step,
      "decay_steps": self.decay_steps,
      "power": self.power,
      "end_factor": self.end_factor,
    }


def _interpolate(step: float, knots: Sequence[tuple[int, float]]) -> float:
  """The progress at `step` (a number) of piecewise-linear `knots`."""
  if step <= knots[0][0]:
    return knots[0][1]
  for (x0, p0), (x1, p1) in zip(knots, knots[1:]):
    if step <= x1:
      return p0 + (p1 - p0) * (step - x0) / (x1 - x0)
  return knots[-1][1]


def _interpolated(step: tf.Tensor, knots: Sequence[tuple[int, float]]):
  """`_interpolate` of a float32 step tensor (traced)."""
  progress = tf.constant(knots[0][1], tf.float32)
  for (x0, p0), (x1, p1) in zip(knots, knots[1:]):
    within = tf.clip_by_value((step - x0) / (x1 - x0), 0.0, 1.0)
    progress = tf.where(step >= x0, p0 + (p1 - p0) * within, progress)
  return progress


@gin.register
def total_train_steps() -> int:
  """`train.train_steps` of the parsed gin config (its default if unbound).

  For schedules in gin (`decay_steps = @total_train_steps()`): gin calls it
  when it builds the schedule, after every file and `--gin_bindings` is
  parsed, so the schedule follows the run's length. A resumed run with
  another length keeps the learning rate continuous: a `WarmupPolyDecay`
  stretches its remaining decay over the new length (`resumed`).
  """
  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.train_settings import TrainSettings  # pylint: disable=g-import-not-at-top

  steps = config.value("train.train_steps")
  return RunLength(TrainSettings().train_steps if steps is None else steps)


def follows_run_length(schedule: Any) -> bool:
  """Whether a schedule was built from `total_train_steps()`."""
  if isinstance(schedule, WarmupPolyDecay):
    return schedule.follows_run_length
  try:
    values = schedule.get_config().values()
  except (AttributeError, NotImplementedError):
    return False
  return any(isinstance(v, RunLength) for v in values)


def resumed(schedule: Any, runs: Sequence[tuple[int, int]]) -> Any:
  """`schedule` as the last of `runs` continues it (see
  `WarmupPolyDecay.resumed`); any other learning rate as it is.

  Raises:
    ScheduleResumeError: a schedule built from `total_train_steps()` that
      cannot be stretched, and a resume changed the run's length.
  """
  if isinstance(schedule, WarmupPolyDecay):
    return schedule.resumed(runs)
  if len(runs) < 2 or not follows_run_length(schedule):
    return schedule
  (_, before), (first, steps) = runs[-2:]
  if steps != before and steps > first:
    raise ScheduleResumeError(
      f"train.train_steps changed from {before} to {steps} on resume, but "
      f"{type(schedule).__name__} takes its length from "
      "@total_train_steps() and cannot be stretched: its learning rate "
      f"would jump at the resume step {first}. Keep train.train_steps = "
      f"{before}, or use WarmupPolyDecay (it stretches its remaining decay "
      "over the new length)."
    )
  return schedule


class _OnStep:
  """`schedule(step)` as a zero-argument learning rate, whose schedule a
  resume may replace (`resume_bound`) before a step is traced."""

  def __init__(self, schedule: Any, step: tf.Variable):
    self.schedule, self.step = schedule, step

  def __call__(self) -> tf.Tensor:
    return self.schedule(self.step)


def resume_bound(optimizers: Iterable[Any], runs: Sequence[tuple[int, int]]):
  """The schedules `bind_to_step` bound in `optimizers`, `resumed` over
  `runs` (each bound schedule once; other learning rates untouched)."""
  seen = set()
  for optimizer in optimizers:
    lr = getattr(optimizer, "learning_rate", None)
    if isinstance(lr, _OnStep) and id(lr) not in seen:
      seen.add(id(lr))
      lr.schedule = resumed(lr.schedule, runs)


def bound_to_step(optimizer: Any, step: tf.Variable) -> Any:
  """`optimizer`, or a copy whose schedule learning rate reads `step`.

  Args:
    optimizer: a `tf.tpu.experimental.embedding` optimizer (or None).
    step: the run's global step variable.

  Returns:
    `optimizer` itself unless its learning rate is a Keras
    `LearningRateSchedule`; then a shallow copy whose `learning_rate` is
    `schedule(step)`, a zero-argument callable. `optimizer` is not changed.
  """
  lr = getattr(optimizer, "learning_rate", None)
  if not isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
    return optimizer
  bound = copy.copy(optimizer)
  bound.learning_rate = _OnStep(lr, step)
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
