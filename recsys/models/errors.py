"""Typed errors models raise for misconfigured features and hyper-parameters.

Every message names the model, the offending feature(s) or parameter, what it
got and what it expected, and how to fix it.
"""

from recsys.errors import SettingsError


class ModelConfigError(SettingsError):
  """A model hyper-parameter is invalid (unknown choice, bad size, ...)."""


class FeatureMismatchError(SettingsError):
  """The activations or features given to a model do not match its specs."""


class EmbeddingDimError(SettingsError):
  """Activations have embedding dimensions the model cannot combine."""
