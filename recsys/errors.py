"""The one base class of recsys's user-facing errors.

Every error `recsys` raises for something a user can fix (a setting, a gin
file, a model dir, the data) derives from `RecsysError` *and* from the
builtin it always was (`ValueError`, `RuntimeError`, `OSError`, ...), so
`except recsys.errors.RecsysError` catches them all and existing
`except ValueError` callers keep working. `backends/` never imports
`recsys` and keeps its own bases.

`SettingsError` marks the errors of settings that ask for what cannot be (a
value out of range, settings that contradict each other): whichever command
meets them, `recsys` exits with status 2 for them, as for gin errors.

Example:
  >>> class TrainerConfigError(SettingsError):
  ...   '''The trainer's settings are inconsistent.'''
"""


class RecsysError(Exception):
  """Base of the errors recsys raises for problems a user can act on."""


class SettingsError(RecsysError, ValueError):
  """A setting asks for what cannot be; `recsys` exits with status 2."""


__all__ = ["RecsysError", "SettingsError"]
