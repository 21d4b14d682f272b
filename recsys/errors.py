"""The base classes of recsys's user-facing errors, with their exit status.

Every error `recsys` raises for something a user can fix (a setting, a gin
file, a model dir, the data) derives from `RecsysError` *and* from the
builtin it always was (`ValueError`, `RuntimeError`, `OSError`, ...), so
`except recsys.errors.RecsysError` catches them all and existing
`except ValueError` callers keep working. `backends/` never imports
`recsys` and keeps its own bases (`backends.errors`), with the same
`exit_status`.

The class decides how `recsys` ends when it meets the error, whichever
command that is (`recsys.process.exits.exit_status` reads it):
`SettingsError` (a setting asks for what cannot be: a value out of range,
an unknown name, settings that contradict each other, a gin error) exits
with status 2, as argparse does for a bad flag; any other `RecsysError`
(the data, the model dir, the host, a NaN loss) with 1.

Example:
  >>> class TrainerConfigError(SettingsError):
  ...   '''The trainer's settings are inconsistent.'''
  >>> TrainerConfigError.exit_status
  2
"""

#: The exit status of a run that failed (data, model dir, host, TensorFlow).
RUNTIME_EXIT_STATUS = 1
#: ... and of settings that ask for what cannot be; argparse's own status.
SETTINGS_EXIT_STATUS = 2


class RecsysError(Exception):
  """Base of the errors recsys raises for problems a user can act on."""

  #: What `recsys` exits with when a command meets this error.
  exit_status: int = RUNTIME_EXIT_STATUS


class SettingsError(RecsysError, ValueError):
  """A setting asks for what cannot be; `recsys` exits with status 2."""

  exit_status = SETTINGS_EXIT_STATUS


__all__ = [
  "RUNTIME_EXIT_STATUS",
  "SETTINGS_EXIT_STATUS",
  "RecsysError",
  "SettingsError",
]
