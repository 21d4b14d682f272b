"""The tables' gradients under Keras's loss scaling (mixed_float16).

With a `mixed_float16` policy `compile()` wraps the optimizer in a
`LossScaleOptimizer`: Keras's `train_step` differentiates the loss times
the loss scale (2**15 at first) and divides the dense gradients by it
before the update; a step whose gradients are not finite is skipped and the
scale halved. The tables' update runs inside that differentiation (the
gradient trap), so it sees the scaled gradient: applied as it came, each
step was ~32,768x too large and the touched rows were NaN within 4 steps.

Here the trap's gradients are divided by the scale the loss was multiplied
by, and their finiteness is agreed over the replicas: non-finite gradients
skip the tables' update, and the trap variable's gradient is then NaN, so a
dynamic loss scaler also sees the step as non-finite (it skips the dense
update and lowers the scale, as for any other overflow). A step whose
dense gradients alone overflow is skipped by Keras for the dense variables
only: the tables' finite gradient has already been applied.
"""

import inspect
from typing import Any

from recsys import _tf_internal
from recsys._keras import tf
from recsys.errors import SettingsError


class LossScalingError(SettingsError):
  """The tables cannot follow the Keras loss scaler's decisions."""


def unscaled(
  gradients: list[Any], scaler: _tf_internal.LossScaler
) -> tuple[list[Any], tf.Tensor]:
  """The true gradients and whether they are finite on every replica.

  Args:
    gradients: d(scaled loss)/d(activation) per activation (None where the
      loss does not use one).
    scaler: the loss scaler of the gradient request.

  Returns:
    (the gradients divided by the loss scale when the loss was scaled, a
    scalar bool: every gradient finite on every replica).
  """
  scale = None
  if scaler.loss_is_scaled:
    scale = tf.convert_to_tensor(scaler.optimizer.loss_scale)
  out: list[Any] = []
  checks = []
  for g in gradients:
    if g is None:
      out.append(None)
      continue
    g = tf.convert_to_tensor(g)  # IndexedSlices too
    if scale is not None:
      g = g / tf.cast(scale, g.dtype)
    out.append(g)
    checks.append(tf.reduce_all(tf.math.is_finite(g)))
  finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
  return out, _agreed(finite)


def _agreed(finite: tf.Tensor) -> tf.Tensor:
  """Finite only if finite on every replica (the replicas update alike)."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return finite
  bad = context.all_reduce(
    tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32)
  )
  return bad < 0.5


def trap_gradient(
  finite: tf.Tensor, trap_variable: Any, scaler: _tf_internal.LossScaler
) -> tf.Tensor:
  """The trap variable's gradient: zero, or NaN for a non-finite step when
  the loss scaler is dynamic (it then skips the step and lowers the scale;
  a fixed scale skips nothing, so it gets zero)."""
  zeros = tf.zeros_like(trap_variable)
  if not scaler.optimizer.dynamic:
    return zeros
  return zeros + tf.where(finite, 0.0, float("nan"))


def check_can_skip(backend: Any, layer_name: str) -> None:
  """Refuses a backend whose update cannot be left out of a step.

  Raises:
    LossScalingError: the backend runs the TPU's own update every step, or
      its `apply_gradients` takes no `apply_if`.
  """
  accepted = inspect.signature(backend.apply_gradients).parameters
  if backend.capabilities.needs_tpu or "apply_if" not in accepted:
    raise LossScalingError(
      f"embedding layer {layer_name!r}: the model's optimizer is a "
      "LossScaleOptimizer (a mixed_float16 policy), whose overflowing steps "
      f"must be skipped, but backend {backend.name!r} cannot leave a step's "
      "update out (it takes no apply_if). Use "
      "tf.keras.mixed_precision.set_global_policy('mixed_bfloat16') (the "
      "TPU's policy, no loss scaling) or 'float32', or a backend that can "
      "(tensorcore, parameter_servers)."
    )
