"""The TensorFlow internals the recsys package reads, in one place.

TensorFlow has no public API for these questions, and the Keras layer needs
them to behave like TFRS's. Each is a small function with the reason it
exists; `tests/test_tf_internal.py` fails when a TensorFlow upgrade removes
what one of them reads, and a test fails when a `tensorflow.python` /
`tensorflow.core` import appears anywhere else in `recsys/`, so an upgrade
is one file to audit (`backends/_tf_internal.py` is the backends' own).
Keras 2 (`tf_keras`) moves with TensorFlow's version, so its optimizers'
private attributes are read here too.
"""

import dataclasses
import itertools
import sys
import threading
import types
from typing import Any

from tensorflow.python.eager import backprop  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.saved_model import save_context  # pylint: disable=g-direct-tensorflow-import

from backends import _tf_internal as backends_door
from recsys._keras import keras, tf

_TAPE_GRADIENT_CODE = backprop.GradientTape.gradient.__code__


# Asked of the backends' door, which reads the same TF internals: a lookup
# made outside every tape never receives gradients, so the layer does not
# leave one waiting for them; a compiled step cannot raise on bad input, so
# the id checks map it to what the backend refuses and counts instead.
tape_is_recording = backends_door.tape_may_record
in_xla_compilation = backends_door.in_xla_context
# A sum over the replicas only on the steps that need one (iALS's Gramians).
summed_when = backends_door.summed_when


def in_saved_model_trace() -> bool:
  """Whether `tf.saved_model.save` (or Keras's `model.save`) is tracing."""
  return bool(save_context.in_save_context())


# The nest helpers `tf.nest` does not export, as the backends' door has them.
flatten_with_joined_string_paths = (
  backends_door.flatten_with_joined_string_paths
)
flatten_up_to = backends_door.flatten_up_to
# An attribute a Keras layer (a Trackable) keeps without tracking it.
NoDependency = backends_door.NoDependency


def keras_learning_rate(optimizer: Any, legacy: bool) -> tuple[Any, float]:
  """A Keras 2 optimizer's learning rate (a variable or a schedule) and its
  legacy `decay` (0 for the new optimizers).

  The legacy optimizers make their hyper-parameter variables at their first
  step; they are made now (under the strategy in scope), so that a step
  reads the variable a callback may change, not the float the optimizer was
  built with.
  """
  if legacy:
    optimizer._create_hypers()  # pylint: disable=protected-access
    schedule = optimizer._hyper["learning_rate"]  # pylint: disable=protected-access
    decay = float(getattr(optimizer, "_initial_decay", 0.0) or 0.0)
    return schedule, decay
  return optimizer._learning_rate, 0.0  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class LossScaler:
  """The Keras `LossScaleOptimizer` a gradient request runs under.

  Attributes:
    optimizer: the `tf.keras.mixed_precision.LossScaleOptimizer`; its
      `apply_gradients` will check the gradients and may skip the step.
    loss_is_scaled: whether the differentiated loss was multiplied by its
      `loss_scale` (Keras's `train_step` and `minimize` do; `tfrs.Model`'s
      `train_step` does not, and Keras then warns that it forgot to).
  """

  optimizer: Any
  loss_is_scaled: bool


class GradientRequest:
  """The `GradientTape.gradient` call that is running, seen from inside it.

  A custom gradient function runs for every op on the path from the target
  back to any watched variable, whatever `sources` the caller asked for; a
  gradient function with side effects (the layer's gradient trap, which
  updates the tables) must act only when the caller asked for its variable.

  Attributes:
    sources: the flat sources of the running `tape.gradient(...)` call.
    persistent: whether that tape can be asked again.
    loss_scaler: the Keras loss scaler of the call (`LossScaler`), or None.
  """

  def __init__(
    self,
    sources: list[Any],
    persistent: bool,
    loss_scaler: LossScaler | None = None,
  ):
    self.sources = sources
    self.persistent = persistent
    self.loss_scaler = loss_scaler

  def covers(self, variable: Any) -> bool:
    """Whether `variable` is among the sources (itself or a wrapper of it,
    e.g. Keras's `AutoCastVariable`, which shares its handle)."""
    handle = _handle(variable)
    return any(
      source is variable or (handle is not None and _handle(source) is handle)
      for source in self.sources
    )


def _handle(variable: Any) -> Any:
  """A variable's resource handle (this replica's), or None for tensors."""
  try:
    return variable.handle
  except (AttributeError, ValueError, RuntimeError, TypeError):
    return None


def current_gradient_request() -> GradientRequest | None:
  """The `tape.gradient` call on this thread's stack, or None.

  None when the gradient is not computed by `GradientTape.gradient` (e.g.
  `tf.gradients` in a graph, which prunes ops off the path to its sources
  by itself, or a function's backward pass built ahead of time).
  """
  frame: types.FrameType | None = sys._getframe(1)  # the only way to see it
  while frame is not None:
    if frame.f_code is _TAPE_GRADIENT_CODE:
      local = frame.f_locals
      sources = local.get("flat_sources_raw")
      tape = local.get("self")
      if sources is None or tape is None:
        return None
      return GradientRequest(
        list(sources),
        bool(getattr(tape, "_persistent", False)),
        _loss_scaler(frame.f_back),
      )
    frame = frame.f_back
  return None


# The methods of Keras's LossScaleOptimizers (current and legacy) that
# multiply the loss by the loss scale and then differentiate it.
_SCALING_METHODS = frozenset(
  ("compute_gradients", "_compute_gradients", "get_gradients")
)


def _loss_scaler(frame: types.FrameType | None) -> LossScaler | None:
  """The loss scaler of the code that called `tape.gradient` from `frame`.

  Keras has no public way to ask which loss scale a gradient carries. Two
  callers are seen: a `LossScaleOptimizer`'s own gradient methods (Keras's
  `train_step`, `minimize`, `compute_gradients` in a custom loop), which
  scale the loss; and a model's `train_step` whose compiled optimizer is a
  `LossScaleOptimizer` (`tfrs.Model`'s, or a custom one), which scaled the
  loss if it called `get_scaled_loss` (the optimizer remembers that).
  """
  lso = keras.mixed_precision.LossScaleOptimizer
  while frame is not None:
    name = frame.f_code.co_name
    if name in _SCALING_METHODS or name == "train_step":
      owner = frame.f_locals.get("self")
      if isinstance(owner, lso) and name in _SCALING_METHODS:
        return LossScaler(owner, loss_is_scaled=True)
      if isinstance(owner, keras.Model) and name == "train_step":
        optimizer = getattr(owner, "optimizer", None)
        if not isinstance(optimizer, lso):
          return None
        scaled = getattr(optimizer, "_loss_has_been_scaled", False)  # pylint: disable=protected-access
        return LossScaler(optimizer, loss_is_scaled=bool(scaled))
    frame = frame.f_back
  return None


# Each MirroredStrategy numbers its collective groups from
# 1 + `_collective_key_base`, a class attribute that is 0 unless changed, so two
# strategies in one process share group and instance keys: a collective of one
# then meets a collective of the other with another shape ("Shape mismatch in
# the collective instance") or device count. Row-sharded tables all-gather
# in every step, so a second strategy in a process (a notebook training twice,
# a test suite) must not reuse the first one's keys.
_COLLECTIVE_KEYS_PER_STRATEGY = 10_000
_collective_bases = itertools.count(1_000_000, _COLLECTIVE_KEYS_PER_STRATEGY)
_collective_lock = threading.Lock()


def mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
  """A `MirroredStrategy` over `devices` with collective keys of its own."""
  cls = tf.distribute.MirroredStrategy
  with _collective_lock:
    saved = cls._collective_key_base  # pylint: disable=protected-access
    cls._collective_key_base = next(_collective_bases)  # pylint: disable=protected-access
    try:
      return cls(devices)
    finally:
      cls._collective_key_base = saved  # pylint: disable=protected-access


__all__ = [
  "GradientRequest",
  "LossScaler",
  "NoDependency",
  "current_gradient_request",
  "flatten_up_to",
  "flatten_with_joined_string_paths",
  "in_saved_model_trace",
  "in_xla_compilation",
  "keras_learning_rate",
  "mirrored_strategy",
  "tape_is_recording",
]
