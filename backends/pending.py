"""Training lookups waiting for their gradients: no silent non-training.

`lookup(..., training=True)` leaves what `apply_gradients` needs (the step's
unique ids, rows, ...) for the same replica. If `apply_gradients` never
comes, the tables silently never train — the classic mistake of dropping a
backend into a Keras model and calling `fit`. `PendingLookups` keeps one
pending lookup per replica thread (MirroredStrategy runs each replica's step
in its own thread) and refuses a second training lookup while one is still
pending, with an error that says what to do.

The check runs in Python when a step runs eagerly or is traced. A traced
step runs many times from one trace, so a backend may also give a runtime
guard (`use_runtime_guard`): a per-replica flag variable that a training
lookup sets and `apply_gradients` clears, checked by the next lookup. A
`tf.function` step that never applies its gradients then fails at its second
call. The guard costs a scalar read and write per step; it is left out of
XLA-compiled steps (which cannot raise: the trace-time check remains) and
under parameter servers (whose workers share variables).

After the error this thread's pending lookup is dropped, so an earlier step
that failed between its lookup and `apply_gradients` causes one error, not
one per step.
"""

import threading
from typing import Any

import tensorflow as tf

from backends import _tf_internal
from backends.errors import BackendError


class UnappliedGradientsError(BackendError, RuntimeError):
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
    self._steps: dict[int, tuple[Any, str]] = {}
    self._lock = threading.Lock()
    self._guard: tf.Variable | None = None

  def use_runtime_guard(self, flag: tf.Variable) -> None:
    """Checks traced steps at run time too, with `flag` (int32 scalar, 0).

    `flag` must be per replica (`VariableSynchronization.ON_READ`), created
    by the backend under its strategy.
    """
    self._guard = flag

  def _guarded(self) -> bool:
    """Whether this trace carries the runtime guard."""
    if self._guard is None or tf.executing_eagerly():
      return False  # eagerly the Python check sees every step
    return not _tf_internal.in_xla_context()

  def _message(self, where: str) -> str:
    return (
      f"embedding backend {self._backend_name!r}: a lookup(..., "
      f"training=True) made {where} was never followed by "
      "apply_gradients(), so its gradients were lost and the tables did not "
      "train. In a custom training step call "
      "backend.apply_gradients(tape.gradient(loss, activations)) after "
      "every lookup(..., training=True); in a Keras model use "
      "recsys.layers.Embedding, whose fit() applies them; for evaluation "
      "and serving use lookup(..., training=False). (If that earlier step "
      "failed with an error before apply_gradients, this error follows "
      "from it: the next lookup starts afresh.)"
    )

  def _check_and_set(self, after: Any) -> None:
    """Runtime: fail if the previous training lookup was not applied.

    The flag is set only once the lookup's outputs exist (`after`), so a
    lookup that fails (e.g. on a bad id) leaves it clear. On failure the
    flag is cleared first: the error is raised once, not at every later step.
    """
    flag = self._guard
    assert flag is not None
    with tf.control_dependencies(
      tf.nest.flatten(after, expand_composites=True)
    ):
      previous = flag.read_value()

    def refuse():
      with tf.control_dependencies([flag.assign(0)]):
        check = tf.debugging.Assert(
          False, [self._message("in an earlier run of this step")]
        )
      with tf.control_dependencies([check]):
        return tf.constant(False)

    ok = tf.cond(tf.equal(previous, 0), lambda: tf.constant(True), refuse)
    with tf.control_dependencies([ok]):
      flag.assign(1)

  def _clear(self) -> None:
    if self._guard is not None and self._guarded():
      self._guard.assign(0)

  def record(self, step: Any, outputs: Any = ()) -> None:
    """Remembers this thread's training lookup.

    Args:
      step: what `apply_gradients` will need (returned by `take`).
      outputs: the lookup's activations; the runtime guard is set after them.

    Raises:
      UnappliedGradientsError: this thread's previous training lookup was
        never followed by `apply_gradients` (its gradients are lost).
    """
    key = threading.get_ident()
    with self._lock:
      previous = self._steps.pop(key, None)
      if previous is None:
        self._steps[key] = (step, _where())
    if previous is not None:
      raise UnappliedGradientsError(self._message(previous[1]))
    if self._guarded():
      self._check_and_set(outputs)

  def take(self) -> Any | None:
    """This thread's pending lookup (removed), or None; clears the guard."""
    with self._lock:
      entry = self._steps.pop(threading.get_ident(), None)
    self._clear()
    return None if entry is None else entry[0]

  def abandon(self) -> None:
    """Drops this thread's pending lookup on purpose (a step left out)."""
    self.take()

  def discard(self) -> None:
    """Forgets every pending lookup (e.g. after a step was abandoned)."""
    with self._lock:
      self._steps.clear()
