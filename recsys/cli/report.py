"""How a failed or stopped `recsys` command tells the user, on stderr.

What the exit status is, `recsys.process.exits` decides; this is only the
wording: one line per error (the traceback with --verbose; a runtime error
says so on a second line, a settings refusal is complete in one), gin's
errors with their file and line on the lines below, a clean stop in its
own words.
"""

import sys

from recsys import errors
from recsys.process import exits

#: The errors of gin files and bindings, by their class's name: their
#: messages name the file and line on lines of their own.
_GIN_ERRORS = ("GinConfigError", "GinFileNotFoundError")
#: Gin errors whose message starts with where the problem is: on one line
#: with the heading (`recsys.gin_config.precheck`: two lines in all).
_GIN_ERRORS_WHERE_FIRST = (
  "UnknownGinNameError",
  "UnreadGinBindingError",
  "RefusedArgumentsError",
)


def failed(
  command: str, error: BaseException, status: int, verbose_flag: bool
) -> None:
  """Prints why `command` ended with `status` because of `error`.

  Args:
    command: the subcommand's name.
    error: what it raised.
    status: its exit status (`exits.exit_status(error)`).
    verbose_flag: the command takes --verbose (the line says so).
  """
  if status in exits.STOPPED_BY_SIGNAL:  # a clean stop, e.g. TrainingPreempted
    text = _short(error)
  elif type(error).__name__ in _GIN_ERRORS:
    text = f"gin configuration error:\n{error}"
  elif type(error).__name__ in _GIN_ERRORS_WHERE_FIRST:
    text = f"gin configuration error: {error}"
  else:
    text = f"{type(error).__name__}: {_short(error)}"
    if verbose_flag and status != errors.SETTINGS_EXIT_STATUS:
      text += "\n(run with --verbose for the traceback)"
  print(f"recsys {command}: {text}", file=sys.stderr)


def interrupted(command: str) -> None:
  """Ctrl-C outside the training loop (which saves, then stops itself)."""
  print(
    f"recsys {command}: interrupted (Ctrl-C); checkpoints already saved are "
    "kept.",
    file=sys.stderr,
  )


def _short(error: BaseException) -> str:
  """An error's own message: TF's OpErrors without their graph-node trail,
  without the "In call to configurable ..." line gin adds."""
  from recsys.gin_config import compat as gin_compat  # pylint: disable=g-import-not-at-top

  message = getattr(error, "message", None) or str(error)
  message = gin_compat.without_call_trail(str(message))
  kept = [
    line
    for line in str(message).splitlines()
    if line.strip()
    and not line.lstrip().startswith(("[[", "\t [[", "In call to configurable"))
    and "Op:__inference" not in line
  ]
  return "\n".join(kept) or str(error)
