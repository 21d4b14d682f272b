"""Typed errors models raise for misconfigured features and hyper-parameters.

Every message names the model, the offending feature(s) or parameter, what it
got and what it expected, and how to fix it.
"""


class ModelConfigError(ValueError):
  """A model hyper-parameter is invalid (unknown choice, bad size, ...)."""


class FeatureMismatchError(ValueError):
  """The activations or features given to a model do not match its specs."""


class EmbeddingDimError(ValueError):
  """Activations have embedding dimensions the model cannot combine."""
