"""How a `recsys` command ends: the exit status of an error or a signal.

The one place that decides it, whichever command runs:

- an error that carries `exit_status` on its class: 2 for settings that
  ask for what cannot be (`recsys.errors.SettingsError`, gin's errors as
  `recsys.config.GinConfigError`, `backends.errors.BackendSettingsError`),
  1 for any other `RecsysError` / `BackendError`; argparse exits with the
  same 2 for a bad flag by itself;
- a training run stopped by a signal after its checkpoint
  (`TrainingPreempted`) carries the status the shell reports for that
  signal: 143 for SIGTERM, 130 for Ctrl-C (SIGINT); Ctrl-C elsewhere is
  130, and SIGTERM before the training loop installs its own handler
  exits with 143 (`sigterm_exits`), not by the signal;
- builtin errors a user can meet (`ValueError`, `RuntimeError`, `OSError`,
  `FloatingPointError`) and TensorFlow's `OpError`s: 1;
- anything else is a bug: no status (`None`), the traceback is shown.
"""

import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Iterator

from recsys import errors

#: The status of a process stopped by SIGTERM (128 + 15): a scheduler sees
#: "terminated", and running the same command again resumes.
SIGTERM_EXIT_STATUS = 143
#: ... and by Ctrl-C (SIGINT, 128 + 2), what shells report for an interrupt.
INTERRUPTED_EXIT_STATUS = 130
#: The statuses of a clean stop on a signal (no error, no traceback).
STOPPED_BY_SIGNAL = (SIGTERM_EXIT_STATUS, INTERRUPTED_EXIT_STATUS)

_BUILTIN_RUNTIME_ERRORS = (
  ValueError,
  RuntimeError,
  OSError,
  FloatingPointError,
)


def exit_status(error: BaseException) -> int | None:
  """The status `recsys` exits with for `error`; None: not a user's problem
  (a bug: the command shows its traceback)."""
  if isinstance(error, KeyboardInterrupt):
    return INTERRUPTED_EXIT_STATUS
  status = getattr(error, "exit_status", None)
  if isinstance(status, int):
    return status
  if isinstance(error, _BUILTIN_RUNTIME_ERRORS):
    return errors.RUNTIME_EXIT_STATUS
  tf = sys.modules.get("tensorflow")  # an OpError implies TF is imported
  op_error = getattr(getattr(tf, "errors", None), "OpError", None)
  if op_error is not None and isinstance(error, op_error):
    return errors.RUNTIME_EXIT_STATUS
  return None


@contextlib.contextmanager
def sigterm_exits(command: str) -> Iterator[None]:
  """SIGTERM in the block exits with 143, not by the signal.

  The training loop installs its own handler (save, then stop with 143,
  `recsys.training.signals`); before it does — TensorFlow's start-up,
  restoring, building — and for evaluate and export there is nothing to
  save, but a scheduler still expects 143. Outside the main thread
  (Python's rule for handlers) the block runs unchanged.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    del signum, frame
    print(
      f"recsys {command}: SIGTERM received outside the training loop; "
      "stopping (checkpoints already saved are kept).",
      file=sys.stderr,
    )
    raise SystemExit(SIGTERM_EXIT_STATUS)

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def skip_final_collection() -> None:
  """Spares the process's exit its last garbage collection.

  Python's shutdown walks every object left for cycles; after TensorFlow
  traced a run's steps that took 1.2 s (a 20-step two-tower run) to 3 s
  (iALS), silent after the command's last line. Everything a command
  writes is flushed and closed when it returns (summaries after each
  write, checkpoints synchronously, the model dir's lock released), and
  the operating system frees the memory; the objects kept until now are
  only frozen (`gc.freeze`), so `atexit` handlers still run. Call it only
  in a process that ends after the command (the `recsys` console script),
  never in one that goes on (a notebook, a test run), whose later
  collections would then skip those objects.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  gc.freeze()
