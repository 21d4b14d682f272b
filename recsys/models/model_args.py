"""What the Trainer passes a model: the arguments its kind declares.

A model class declares the constructor arguments the Trainer fills from the
data source in `TRAINER_ARGUMENTS` (`RankingModel`: `feature_specs`,
`num_dense`; `RetrievalModel`: also `query_features`, `candidate_features`,
`candidate_id_feature`); `model_kwargs` gives a factory those values.

Example:
  >>> model = DLRM(**model_kwargs(DLRM, SyntheticCTR()))
"""

import functools
from typing import Any

from recsys.models.base import RankingModel


def model_arguments(factory: Any) -> tuple[str, ...]:
  """The constructor arguments the model `factory` builds declares.

  `RankingModel.TRAINER_ARGUMENTS` or `RetrievalModel.TRAINER_ARGUMENTS`
  for a model class, a gin-wrapped one (a subclass) or a `functools.partial`
  of one; ranking's (`feature_specs`, `num_dense`) for any other factory,
  unless it declares its own `TRAINER_ARGUMENTS`.
  """
  target = factory
  while isinstance(target, functools.partial):
    target = target.func
  return tuple(
    getattr(target, "TRAINER_ARGUMENTS", RankingModel.TRAINER_ARGUMENTS)
  )


def source_values(source: Any) -> dict[str, Any]:
  """The values a data source offers a model, by argument name."""
  kwargs = {
    "feature_specs": list(source.feature_specs),
    "num_dense": int(getattr(source, "num_dense", 0) or 0),
  }
  for attr in (
    "query_features",
    "candidate_features",
    "candidate_id_feature",
  ):
    if hasattr(source, attr):
      kwargs[attr] = getattr(source, attr)
  return kwargs


def model_kwargs(factory: Any, source: Any) -> dict[str, Any]:
  """The keyword arguments to build `factory`'s model on `source`'s data."""
  values = source_values(source)
  return {k: values[k] for k in model_arguments(factory) if k in values}
