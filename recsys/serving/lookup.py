"""The tables' activations outside a training step: the serving path.

A SavedModel's signatures, retrieval evaluation and corpus indexing read the
trained tables in place on one device, with no strategy and no tape
(`backends.mid_level.serving.serving_lookup`). Here a batch in the data contract
(`recsys.data`) becomes the backend's `(ids, weights)` (`split_batch`, which
the training step uses too) and then activations (`serving_activations`).
Serving sits below training: this module never imports `recsys.training`.

Example:
  >>> acts = serving_activations(backend, features, ["user", "item"])
  >>> acts["user"].shape  # [B, D]
"""

from collections.abc import Mapping
from typing import Any

from backends.mid_level import serving
from recsys._keras import tf


@tf.autograph.experimental.do_not_convert
def split_batch(
  batch: tuple[Mapping[str, Any], Any], feature_names
) -> tuple[dict[str, Any], dict[str, Any] | None]:
  """The backend's (ids, weights) structures from a data batch's features.

  Args:
    batch: `(features, labels)` in the data contract: `features["categorical"]`
      and optionally `features["weights"]` (weighted features only).
    feature_names: the keys of the backend's feature_config.

  Returns:
    `(ids, weights)`, both dicts keyed exactly by `feature_names` (weights has
    None for unweighted features), or weights None if no feature is weighted.
  """
  features = batch[0]
  categorical = features["categorical"]
  weights = features.get("weights") or {}
  ids = {name: categorical[name] for name in feature_names}
  if not any(name in weights for name in feature_names):
    return ids, None
  return ids, {name: weights.get(name) for name in feature_names}


def with_ids(batch: tuple[Any, ...], ids: Mapping[str, Any]) -> tuple:
  """`batch` (`(features, labels, ...)`) with `features["categorical"]`'s
  entries named in `ids` replaced (e.g. raw ids made rows by
  `backend.map_ids`); the rest of the batch as it is."""
  features = dict(batch[0])
  categorical = dict(features["categorical"])
  categorical.update(ids)
  features["categorical"] = categorical
  return (features, *batch[1:])


def maps_ids(backend: Any) -> bool:
  """Whether `backend` has dynamic-vocabulary tables, whose batches go
  through `map_batch_ids` before their step."""
  return any(held.dynamic for held in backend.layouts().values())


def map_batch_ids(backend: Any, batch: tuple, names, training: bool):
  """`batch` with its dynamic-vocabulary tables' raw ids made rows
  (`backend.map_ids`): run in a replica function, outside any compiled
  step, before the step that looks the rows up."""
  ids, _ = split_batch(batch, names)
  return with_ids(batch, backend.map_ids(ids, training=training))


def serving_activations(
  backend: Any, features: Mapping[str, Any], feature_names
) -> dict[str, tf.Tensor]:
  """Activations of `feature_names` from a backend's tables, on one device.

  The serving path (`backends.mid_level.serving.serving_lookup`): it reads the
  tables in place, outside `strategy.run`, with the output-shape convention of
  every backend, and needs only the features named (e.g. one retrieval tower's).

  Args:
    backend: a built backend (`embedding_tables`, `feature_config`).
    features: a batch's features in the data contract (`"categorical"`,
      optionally `"weights"`).
    feature_names: the features to look up (a subset of feature_config).

  Returns:
    Feature name -> `[B, D]` (or `[B, L, D]` for sequence features).
  """
  ids, weights = split_batch((features, None), feature_names)
  return serving.serving_lookup(
    ids, weights, backend.embedding_tables, backend.feature_config
  )
