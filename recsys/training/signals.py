"""Stop requests from the outside world: SIGTERM (preemption) and Ctrl-C.

Cloud schedulers preempt a job with SIGTERM and a grace period; a user stops
one with Ctrl-C. Neither should lose the steps since the last checkpoint.
`StopRequests` turns the first such signal into a flag that the training loop
reads between compiled loops (where the model state is consistent), so the
trainer can save a checkpoint at the exact step and exit cleanly. A second
Ctrl-C restores Python's default behaviour (KeyboardInterrupt at once).
"""

import logging
import signal
import threading
from typing import Any

from recsys.errors import RecsysError
from recsys.process import exits

log = logging.getLogger("recsys.training")


class TrainingPreempted(RecsysError, RuntimeError):
  """Training stopped on a signal after saving a checkpoint.

  Attributes:
    step: the step the checkpoint holds.
    checkpoint: its path.
    signal_name: "SIGTERM" or "SIGINT".
    exit_status: the process status `recsys train` exits with: 143 after
      SIGTERM, 130 after Ctrl-C (SIGINT), as the shell reports each
      (`recsys.process.exits`).
  """

  def __init__(self, step: int, checkpoint: str, signal_name: str):
    super().__init__(
      f"{signal_name} received: saved checkpoint {checkpoint} at step "
      f"{step} and stopped; run the same command again to resume."
    )
    self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name

  @property
  def exit_status(self) -> int:  # type: ignore[override]
    # A property, not an attribute set in __init__: gin re-raises the error
    # as a subclass instance that forwards only missing attributes to it.
    if getattr(self, "signal_name", None) == "SIGINT":
      return exits.INTERRUPTED_EXIT_STATUS
    return exits.SIGTERM_EXIT_STATUS


class StopRequests:
  """Records SIGTERM/SIGINT while active (a context manager).

  Handlers are installed only from the main thread (Python's rule); elsewhere
  the object is inert and `requested` stays None.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested: str | None = None
    self._previous: dict[int, Any] = {}

  def _handle(self, signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if self.requested is not None and signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      raise KeyboardInterrupt
    self.requested = self.requested or name
    log.warning(
      "%s received: finishing the current loop, then saving a "
      "checkpoint and stopping (Ctrl-C again to abort at once).",
      name,
    )

  def __enter__(self) -> "StopRequests":
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()
