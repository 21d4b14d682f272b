"""The typed errors of recsys.data that more than one source raises."""

from recsys.errors import RecsysError


class DatasetNotFoundError(RecsysError, FileNotFoundError, RuntimeError):
  """Data files are missing; the message names the folder and what goes in."""


class DataFormatError(RecsysError, ValueError):
  """A data file has not the expected layout; the message names file, line."""


class EmptyEvalSetError(RecsysError, ValueError):
  """The evaluation split has no example to score."""
