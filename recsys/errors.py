"""The one base class of recsys's user-facing errors.

Every error `recsys` raises for something a user can fix (a setting, a gin
file, a model dir, the data) derives from `RecsysError` *and* from the
builtin it always was (`ValueError`, `RuntimeError`, `OSError`, ...), so
`except recsys.errors.RecsysError` catches them all and existing
`except ValueError` callers keep working. `backends/` never imports
`recsys` and keeps its own bases.

Example:
  >>> class TrainerConfigError(RecsysError, ValueError):
  ...   '''The trainer's settings are inconsistent.'''
"""


class RecsysError(Exception):
  """Base of the errors recsys raises for problems a user can act on."""


__all__ = ["RecsysError"]
