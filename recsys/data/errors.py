"""The typed errors of recsys.data that more than one source raises."""

from recsys.errors import RecsysError


class DatasetNotFoundError(RecsysError, FileNotFoundError, RuntimeError):
  """Data files are missing; the message names the folder and what to put there."""


class DataFormatError(RecsysError, ValueError):
  """A data file does not have the expected layout; the message names file and line."""
