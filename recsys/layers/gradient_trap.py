"""The gradient trap: how `fit` trains embedding tables it cannot see.

Keras's `train_step` differentiates the loss with respect to
`model.trainable_variables` and hands the result to the Keras optimizer. The
tables of an embedding backend are not among those variables (their
optimizer is the backend's, with TPU math), so nothing would train them.

The trap routes the activations through an identity whose only differentiable
input is a one-element "trap" variable that *is* trainable. When Keras takes
the gradient of the loss with respect to its variables, the identity's
gradient function runs with d(loss)/d(activations): it calls the backend's
`apply_gradients` with them (inside the same replica step, so the backend
sums the touched rows over replicas as in any other step) and returns a zero
gradient for the trap variable, which the Keras optimizer then leaves at 0.
No `train_step` override is needed, so any `tf.keras.Model` or `tfrs.Model`
works, and so does a custom loop that applies a Keras optimizer to
`model.trainable_variables`.

A tape runs the gradient function whenever the loss reaches the
activations, whatever the caller asked for; the tables move only when the
request covers the trap variable (as `fit` and `model.trainable_variables`
do). `tape.gradient(loss, dense_kernel)` leaves them alone.

Under Keras's loss scaling (a `mixed_float16` policy) the gradients that
reach the trap are those of the scaled loss: they are unscaled and checked
here (`loss_scaling`) before the tables see them.

This module is the only place that knows this trick; everything else calls
the backend's `lookup` and `apply_gradients` explicitly.
"""

from collections.abc import Callable
from typing import Any

from recsys import _tf_internal
from recsys._keras import tf
from recsys.layers import loss_scaling


def trap(
  activations: list[tf.Tensor],
  trap_variable: tf.Variable,
  apply_gradients: Callable[[list[Any], tf.Tensor | None], None],
  not_requested: Callable[[bool], None],
) -> list[tf.Tensor]:
  """Activations that call `apply_gradients` when a tape differentiates them.

  Args:
    activations: flat list of the tensors a training lookup returned.
    trap_variable: a trainable variable of the Keras layer (its value is
      unused); it puts the activations on the path from the loss to
      `model.trainable_variables`.
    apply_gradients: called with the flat list of d(loss)/d(activation)
      (None where the loss does not use one) when a gradient request covers
      `trap_variable` (or cannot be seen, e.g. `tf.gradients`), and None or,
      under a Keras loss scaler, a scalar bool: whether the (unscaled)
      gradients are finite on every replica; the update must be skipped
      when they are not.
    not_requested: called instead when the request does not cover it, with
      whether the tape may be asked again (persistent).

  Returns:
    The activations (identities), in the same order.
  """

  @tf.custom_gradient
  def identity(anchor, *acts):
    del anchor

    def grad(*upstream):
      # Zero for the anchor; nothing flows back into the lookup itself: the
      # backend's optimizer, not the tape, updates the tables.
      anchor = tf.zeros_like(trap_variable)
      request = _tf_internal.current_gradient_request()
      scaler = None if request is None else request.loss_scaler
      if request is not None and not request.covers(trap_variable):
        not_requested(request.persistent)
      elif scaler is None:
        apply_gradients(list(upstream), None)
      else:
        gradients, finite = loss_scaling.unscaled(list(upstream), scaler)
        apply_gradients(gradients, finite)
        anchor = loss_scaling.trap_gradient(finite, trap_variable, scaler)
      return (anchor,) + (None,) * len(acts)

    return [tf.identity(a) for a in acts], grad

  return list(identity(tf.convert_to_tensor(trap_variable), *activations))
