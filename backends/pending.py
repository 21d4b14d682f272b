"""Training lookups waiting for their gradients: no silent non-training.

`lookup(..., training=True)` leaves what `apply_gradients` needs (the step's
unique ids, rows, ...) for the same replica. If `apply_gradients` never
comes, the tables silently never train — the classic mistake of dropping a
backend into a Keras model and calling `fit`. `PendingLookups` keeps one
pending lookup per replica thread (MirroredStrategy runs each replica's step
in its own thread) and refuses a second training lookup while one is still
pending, with an error that says what to do.

The check runs in Python, when a step runs eagerly or is traced: it costs
nothing in the compiled step. An eager loop that forgets `apply_gradients`
fails at its second step; a `tf.function` step at its next trace, or at the
next training lookup outside it.

After the error this thread's pending lookup is dropped, so an earlier step
that failed between its lookup and `apply_gradients` causes one error, not
one per step.
"""

import threading
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf


class UnappliedGradientsError(RuntimeError):
  """A training lookup's gradients were never applied before the next one."""
  # Raised while a tf.function traces: AutoGraph re-raises an error with its
  # own type only if the type's __init__ is Exception's (else StagingError).
  __init__ = Exception.__init__


def _where() -> str:
  """'eagerly' or 'while tracing <graph name>' for the error message."""
  if tf.executing_eagerly():
    return "eagerly"
  graph = tf.compat.v1.get_default_graph()
  return f"while tracing {getattr(graph, 'name', 'a graph')!r}"


class PendingLookups:
  """Each replica thread's training lookup awaiting `apply_gradients`.

  Args:
    backend_name: named in error messages.
  """

  def __init__(self, backend_name: str):
    self._backend_name = backend_name
    self._steps: Dict[int, Tuple[Any, str]] = {}
    self._lock = threading.Lock()

  def record(self, step: Any) -> None:
    """Remembers this thread's training lookup.

    Raises:
      UnappliedGradientsError: this thread's previous training lookup was
        never followed by `apply_gradients` (its gradients are lost).
    """
    key = threading.get_ident()
    with self._lock:
      previous = self._steps.pop(key, None)
      if previous is None:
        self._steps[key] = (step, _where())
        return
    raise UnappliedGradientsError(
        f"embedding backend {self._backend_name!r}: a lookup(..., "
        f"training=True) made {previous[1]} was never followed by "
        "apply_gradients(), so its gradients were lost and the tables did not "
        "train. In a custom training step call "
        "backend.apply_gradients(tape.gradient(loss, activations)) after "
        "every lookup(..., training=True); in a Keras model use "
        "recsys.layers.Embedding, whose fit() applies them; for evaluation "
        "and serving use lookup(..., training=False). (If that earlier step "
        "failed with an error before apply_gradients, this error follows "
        "from it: the next lookup starts afresh.)")

  def take(self) -> Optional[Any]:
    """This thread's pending lookup (removed), or None."""
    with self._lock:
      entry = self._steps.pop(threading.get_ident(), None)
    return None if entry is None else entry[0]

  def discard(self) -> None:
    """Forgets every pending lookup (e.g. after a step was abandoned)."""
    with self._lock:
      self._steps.clear()
