"""The base classes of the backends' errors, with their exit status.

`backends/` never imports `recsys`, so these are the counterparts of
`recsys.errors.RecsysError` and `SettingsError`: the same `exit_status`
attribute, read by `recsys.process.exits` whichever command meets the
error. `BackendSettingsError`: a configuration the backends cannot honour
(an unknown backend or option, a table option the hardware cannot do, a
backend that cannot run under this strategy), exit status 2; any other
`BackendError` (the ids fed in, a checkpoint, the host), 1.

Each error keeps the builtin it always derived from (`ValueError`,
`RuntimeError`, ...), so `except ValueError` callers keep working.
"""


class BackendError(Exception):
  """Base of the errors the embedding backends raise."""

  #: What `recsys` exits with when a command meets this error (as
  #: `recsys.errors.RUNTIME_EXIT_STATUS`).
  exit_status: int = 1


class BackendSettingsError(BackendError):
  """A configuration the backends cannot honour; `recsys` exits with 2 (as
  `recsys.errors.SettingsError`)."""

  exit_status = 2


__all__ = ["BackendError", "BackendSettingsError"]
