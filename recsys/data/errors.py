"""The typed errors of recsys.data that more than one source raises."""


class DatasetNotFoundError(FileNotFoundError, RuntimeError):
  """Data files are missing; the message names the folder and what to put there."""


class DataFormatError(ValueError):
  """A data file does not have the expected layout; the message names file and line."""
