"""Keras optimizers as embedding optimizers: what TFRS's layer accepts.

TFRS's `TPUEmbedding` layer takes a `tf.tpu.experimental.embedding`
optimizer, a name ("sgd", "adagrad", "adam", "ftrl") or a Keras optimizer,
and its tutorials pass one Keras optimizer to both the layer and
`compile()`. The tables are still trained with the embedding optimizer's
math (the TPU's, docs/optimizers.md), so a Keras optimizer is *translated*:
the same class with the hyper-parameters that carry over. The Keras object
itself is only read, never stepped: it creates no slots for the tables and
its iterations, learning rate and slots stay as `compile()` or a custom loop
leaves them.

What carries over:

* the learning rate, read on every step from the Keras optimizer: a
  constant, a variable a callback changes (`ReduceLROnPlateau`), a
  `LearningRateSchedule` and the legacy `decay` at the step `ScheduleStep`
  gives: the Keras optimizer's `iterations` when something applies that
  optimizer (`compile()` sharing it, `optimizer.apply_gradients` in a
  loop), else the number of steps the layer applied;
* per class: Adagrad's `initial_accumulator_value`; Adam's `beta_1`,
  `beta_2`, `epsilon` (AdamW also its weight decay); FTRL's
  `learning_rate_power`, `initial_accumulator_value`, `l1`/`l2`
  regularization and `beta`;
* `clipvalue` (gradient clipping) and, for Keras 2 optimizers,
  `weight_decay` (as `weight_decay_factor` times the learning rate, on the
  rows a step touches, as on a TPU).

What does not is refused, as TFRS's layer refuses it: a setting the user
chose that the embedding optimizer cannot apply (SGD's `momentum` and
`nesterov`, Adam's `amsgrad`, a non-default Adagrad `epsilon`, FTRL's L2
shrinkage, `clipnorm`, `global_clipnorm`, `use_ema`) raises
`OptimizerTranslationError` naming it, unless the caller passes
`ignore_unsupported_settings=True` (the layer's
`ignore_unsupported_optimizer_settings`): the tables then train without
it, and it is listed in `Translation.not_kept`, which the layer logs once
per table. What is the TPU's math rather than a setting is only listed:
Adam's bias correction and epsilon placement (the TPU's Adam has no bias
correction and puts epsilon inside the square root), Keras Adagrad's
default epsilon. Unlike TFRS, `clipvalue` and the legacy `decay` are kept
(above), not refused.

Example:
  >>> t = translate(tf.keras.optimizers.Adagrad(0.1))
  >>> type(t.optimizer).__name__, t.not_kept
  ('Adagrad', ('epsilon=1e-07 (the TPU Adagrad has no epsilon)',))
"""

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

from backends import base
from recsys import _tf_internal
from recsys._keras import keras, tf
from recsys.errors import SettingsError

embedding = tf.tpu.experimental.embedding
_Schedule = keras.optimizers.schedules.LearningRateSchedule

#: Names TFRS's layer accepts, with TF's default hyper-parameters.
OPTIMIZER_NAMES: dict[str, type] = {
  "sgd": embedding.SGD,
  "adagrad": embedding.Adagrad,
  "adam": embedding.Adam,
  "ftrl": embedding.FTRL,
}

# Keras optimizer class name -> the embedding optimizer it becomes.
_TARGETS: dict[str, type] = {
  "SGD": embedding.SGD,
  "Adagrad": embedding.Adagrad,
  "Adam": embedding.Adam,
  "AdamW": embedding.Adam,
  "Ftrl": embedding.FTRL,
}


class OptimizerTranslationError(SettingsError):
  """An optimizer argument that has no embedding-optimizer counterpart."""


@dataclasses.dataclass(frozen=True)
class Translation:
  """An embedding optimizer and where it came from.

  Attributes:
    optimizer: a `tf.tpu.experimental.embedding` optimizer, or None.
    source: what was given, for the log ("Keras Adagrad (legacy)").
    not_kept: what the embedding optimizer does not apply, each with its
      value and the reason: the TPU's math where it differs, and the
      settings `ignore_unsupported_settings` let through.
    schedule_step: where a Keras schedule (or legacy decay) reads its step,
      for the layer to count its steps into; None without one.
  """

  optimizer: Any
  source: str
  not_kept: tuple[str, ...] = ()
  schedule_step: "ScheduleStep | None" = None

  @property
  def translated(self) -> bool:
    return self.source.startswith("Keras")


def is_keras_optimizer(optimizer: Any) -> bool:
  """Whether `optimizer` is a Keras 2 optimizer (current or legacy)."""
  return isinstance(
    optimizer, (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
  )


def translate(
  optimizer: Any, ignore_unsupported_settings: bool = False
) -> Translation:
  """The embedding optimizer for anything TFRS's layer accepts.

  Args:
    optimizer: None; a `tf.tpu.experimental.embedding` optimizer (kept as
      it is); a name, "sgd", "adagrad", "adam" or "ftrl" (TF's defaults);
      or a Keras SGD, Adagrad, Adam, AdamW or Ftrl (current or legacy).
    ignore_unsupported_settings: translate a Keras optimizer whose chosen
      settings the embedding optimizer cannot apply (momentum, amsgrad,
      clipnorm, ...) without them, listing them in `not_kept`; by default
      they are refused.

  Raises:
    OptimizerTranslationError: an unknown name, an optimizer with no
      embedding counterpart (e.g. RMSprop), naming what is accepted, or a
      setting the tables cannot take, naming it and what to do.
  """
  if optimizer is None or isinstance(optimizer, base.OPTIMIZER_CLASSES):
    return Translation(optimizer, "embedding optimizer")
  if isinstance(optimizer, str):
    cls = OPTIMIZER_NAMES.get(optimizer.lower())
    if cls is None:
      raise OptimizerTranslationError(
        f"unknown embedding optimizer name {optimizer!r}; use one of "
        f"{', '.join(repr(n) for n in OPTIMIZER_NAMES)}, a Keras "
        "optimizer or a tf.tpu.experimental.embedding optimizer."
      )
    return Translation(cls(), f"the name {optimizer!r}")
  if is_keras_optimizer(optimizer):
    return _from_keras(optimizer, ignore_unsupported_settings)
  raise OptimizerTranslationError(
    f"optimizer is a {type(optimizer).__name__}; expected a "
    "tf.tpu.experimental.embedding optimizer (SGD, Adagrad, AdagradMomentum, "
    "Adam, FTRL), one of the names "
    f"{', '.join(repr(n) for n in OPTIMIZER_NAMES)}, a Keras "
    f"{', '.join(_TARGETS)} optimizer, or None."
  )


def _from_keras(opt: Any, ignore_unsupported: bool) -> Translation:
  name = type(opt).__name__
  legacy = isinstance(opt, keras.optimizers.legacy.Optimizer)
  source = f"Keras {name}" + (" (legacy)" if legacy else "")
  target = next(
    (_TARGETS[c.__name__] for c in type(opt).__mro__ if c.__name__ in _TARGETS),
    None,
  )
  if target is None:
    raise OptimizerTranslationError(
      f"optimizer is a {source}, which has no embedding-optimizer "
      f"counterpart; the tables take SGD, Adagrad, Adam (AdamW) or FTRL: "
      f"pass one of those (Keras or tf.tpu.experimental.embedding), or give "
      "the layer its own optimizer and keep this one for compile()."
    )
  config = opt.get_config()
  notes: list[str] = []  # the TPU's math, not a setting: listed only
  unsupported: list[str] = []  # settings chosen that the tables cannot take

  def chosen(key: str, reason: str) -> None:
    value = config.get(key)
    if value not in (None, False) and value != _default(opt, key):
      unsupported.append(f"{key}={value!r} ({reason})")

  if target is embedding.Adagrad:
    if config.get("epsilon") == _default(opt, "epsilon"):
      notes.append(
        f"epsilon={config['epsilon']!r} (the TPU Adagrad has no epsilon)"
      )
    chosen("epsilon", "the TPU Adagrad has no epsilon")
  elif target is embedding.Adam:
    notes.append(
      "bias correction and epsilon outside the square root (the TPU Adam "
      "has no bias correction and adds epsilon inside it)"
    )
    chosen("amsgrad", "the TPU Adam has no AMSGrad")
  elif target is embedding.FTRL:
    chosen(
      "l2_shrinkage_regularization_strength",
      "the TPU FTRL has no L2 shrinkage",
    )
  else:
    chosen("momentum", "the TPU SGD has no momentum")
    chosen("nesterov", "the TPU SGD has no momentum")
  for key in ("clipnorm", "global_clipnorm"):
    chosen(key, "clipping by norm is not an embedding optimizer setting")
  chosen("use_ema", "no moving average of the tables is kept")
  if unsupported and not ignore_unsupported:
    raise OptimizerTranslationError(
      f"the {source}'s {'; '.join(unsupported)}: the embedding tables "
      "cannot be trained with it, and would silently train without it. "
      "Give the layer an optimizer without it (a Keras one, or a "
      "tf.tpu.experimental.embedding optimizer; a model's compile() can "
      "keep this one), or pass ignore_unsupported_optimizer_settings=True "
      "to recsys.layers.Embedding to train the tables without it (logged "
      "once per table)."
    )

  learning_rate, schedule_step = _learning_rate(opt, legacy)
  kwargs: dict[str, Any] = {"learning_rate": learning_rate}
  if target is embedding.Adagrad:
    kwargs["initial_accumulator_value"] = config["initial_accumulator_value"]
  elif target is embedding.Adam:
    for key in ("beta_1", "beta_2", "epsilon"):
      kwargs[key] = config[key]
  elif target is embedding.FTRL:
    for key in (
      "learning_rate_power",
      "initial_accumulator_value",
      "l1_regularization_strength",
      "l2_regularization_strength",
      "beta",
    ):
      kwargs[key] = config[key]
  clipvalue = config.get("clipvalue")
  if clipvalue is not None:
    kwargs["clipvalue"] = float(clipvalue)
  weight_decay = config.get("weight_decay")
  if weight_decay:
    kwargs["weight_decay_factor"] = float(weight_decay)
    kwargs["multiply_weight_decay_factor_by_learning_rate"] = True
  return Translation(
    target(**kwargs), source, tuple(notes + unsupported), schedule_step
  )


def _default(opt: Any, key: str) -> Any:
  """The default of `key` in `opt`'s constructor; None if it takes no such
  argument (the legacy optimizers take `clipnorm` as a keyword)."""
  parameter = inspect.signature(type(opt).__init__).parameters.get(key)
  if parameter is None or parameter.default is inspect.Parameter.empty:
    return None
  return parameter.default


class ScheduleStep:
  """The step a Keras optimizer's schedule (or legacy decay) is read at.

  TFRS reads a schedule at the Keras optimizer's `iterations`, which only
  what applies that optimizer advances: `compile()` when the layer shares
  it, but nothing when it is the layer's alone (TFRS's separate embedding
  optimizer), whose tables then trained at `schedule(0)` forever. The step
  here is the larger of `iterations` and the number of steps the layer
  applied (`count`, a variable of the layer, checkpointed with it): an
  optimizer `compile()` shares counts each step once, as before; a
  layer-only one counts the layer's steps. The Keras object is only read.

  Attributes:
    optimizer: the Keras optimizer.
    count: the layer's applied steps (int64 variable), or None before the
      layer builds it (then `iterations` alone).
  """

  def __init__(self, optimizer: Any):
    self.optimizer = optimizer
    self.count: Any = None

  def value(self) -> tf.Tensor:
    """The step now, float32."""
    step = tf.cast(self.optimizer.iterations, tf.int64)
    if self.count is not None:
      step = tf.maximum(step, tf.cast(self.count, tf.int64))
    return tf.cast(step, tf.float32)

  def advance(self) -> None:
    """Counts one applied step (after the update that read `value`)."""
    if self.count is not None:
      self.count.assign_add(1)


def _learning_rate(
  opt: Any, legacy: bool
) -> tuple[Callable[[], tf.Tensor], ScheduleStep | None]:
  """A callable that reads `opt`'s learning rate now (see the module doc),
  and the `ScheduleStep` it reads a schedule at (None: no schedule).

  Called in every traced step, so it reads variables, never Python values
  fixed when the step was traced.
  """
  # The legacy optimizers' variables are made now, not at their first step.
  schedule, decay = _tf_internal.keras_learning_rate(opt, legacy)
  uses_steps = isinstance(schedule, _Schedule) or decay > 0
  steps = ScheduleStep(opt) if uses_steps else None
  if uses_steps:
    opt.iterations  # noqa: B018  (made now, not inside a traced step)

  def current() -> tf.Tensor:
    step = None if steps is None else steps.value()
    if isinstance(schedule, _Schedule):
      lr = schedule(step)
    elif callable(schedule) and not isinstance(schedule, tf.Variable):
      lr = schedule()
    else:
      lr = schedule
    lr = tf.cast(lr, tf.float32)
    if step is not None and decay > 0:
      lr = lr / (1.0 + decay * step)
    return lr

  return current, steps


def describe(optimizer: Any) -> str:
  """`Adagrad(learning_rate=0.1, initial_accumulator_value=0.1)` for logs."""
  if optimizer is None:
    return "None"
  lr = optimizer.learning_rate
  shown = [
    "learning_rate="
    + ("<from the Keras optimizer>" if callable(lr) else f"{lr:g}")
  ]
  for key in (
    "initial_accumulator_value",
    "beta_1",
    "beta_2",
    "epsilon",
    "learning_rate_power",
    "l1_regularization_strength",
    "l2_regularization_strength",
    "beta",
    "weight_decay_factor",
  ):
    value = getattr(optimizer, key, None)
    if isinstance(value, (int, float)) and not (
      key == "weight_decay_factor" and not value
    ):
      shown.append(f"{key}={value:g}" if math.isfinite(value) else key)
  lo, hi = (
    getattr(optimizer, "clip_gradient_min", None),
    getattr(optimizer, "clip_gradient_max", None),
  )
  if lo is not None or hi is not None:
    shown.append(f"clipvalue=({lo}, {hi})")
  return f"{type(optimizer).__name__}({', '.join(shown)})"
