"""A run's data as data sources: plain `tf.data.Dataset`s wrapped.

A run trains on a `DataSource` and evaluates on another (or the same one).
Python callers may give plain unbatched `tf.data.Dataset`s instead, with
the tables to train (`feature_config`): `run_sources` wraps them into one
`DatasetSource` holding both splits, so everything past this point reads
data sources only. The settings' own checks (batch sizes against the
replicas, a data source where one is expected) are
`recsys.train_settings.check`'s.

Example:
  >>> source, eval_source = run_sources(train_ds, eval_ds, feature_config)
  >>> source is eval_source   # one DatasetSource, both splits
  True
"""

import logging
from collections.abc import Mapping
from typing import Any

from recsys._keras import tf
from recsys.data.from_dataset import DatasetSource
from recsys.errors import SettingsError

log = logging.getLogger("recsys.data")


class SourceSettingsError(SettingsError):
  """Data given in a form that cannot become a data source (exit status 2):
  a `tf.data.Dataset` without `feature_config`, or with `embedding` too."""


def run_sources(
  source: Any,
  eval_source: Any,
  feature_config: Mapping[str, Any] | None = None,
  embedding: Any = None,
) -> tuple[Any, Any]:
  """`(source, eval_source)` a run trains and evaluates on.

  Args:
    source: the training data: a data source, or an unbatched
      `tf.data.Dataset` of `(features, label)` (with `feature_config`).
    eval_source: the evaluation data, of the same kind; None: `source`
      (with a dataset and no eval dataset a warning says the evaluation
      scores the training data).
    feature_config: the tables of a dataset's features, used as they are
      (`train.feature_config`); None for data sources.
    embedding: `train.embedding` (tables built from a source's feature
      specs); refused together with `feature_config`.

  Returns:
    Both sources; data sources pass as they are (not checked here: see
    `recsys.train_settings.check`), datasets become one `DatasetSource`.

  Raises:
    SourceSettingsError: a dataset without `feature_config`, both
      `feature_config` and `embedding`, or `feature_config` with a source
      that is not a dataset.
  """
  is_dataset = [isinstance(s, tf.data.Dataset) for s in (source, eval_source)]
  if feature_config is None:
    if any(is_dataset):
      raise SourceSettingsError(
        "a tf.data.Dataset as train data needs feature_config= (dict feature "
        "name -> tf.tpu.experimental.embedding.FeatureConfig); or give a "
        "data source with feature_specs."
      )
    return source, eval_source if eval_source is not None else source
  if embedding is not None:
    raise SourceSettingsError(
      "give either feature_config= (tables as they are) or embedding= "
      "(settings to build tables from a source's feature specs), not both."
    )
  if not is_dataset[0]:
    raise SourceSettingsError(
      f"feature_config= goes with an unbatched tf.data.Dataset as source; "
      f"got a {type(source).__name__}."
    )
  if eval_source is None:
    log.warning(
      "no eval_source: evaluation scores the training dataset itself, so its "
      "eval/ metrics measure fit, not generalization; pass "
      "eval_source=<a held-out tf.data.Dataset> to score unseen examples."
    )
  eval_dataset = eval_source if is_dataset[1] else None
  wrapped = DatasetSource(source, feature_config, eval_dataset=eval_dataset)
  if eval_source is None or eval_dataset is not None:
    return wrapped, wrapped
  return wrapped, eval_source  # another kind of eval data: checked later
