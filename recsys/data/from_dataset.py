"""`DatasetSource`: a user's own `tf.data.Dataset` as a Trainer data source.

Users who already have a `tf.data.Dataset` of feature dicts and TF's
`FeatureConfig`s should not have to write a `DataSource` subclass to use the
Trainer. This adapter reads an *unbatched* dataset of `(features, label)`
where `features` maps each feature name of `feature_config` to its ids (a
scalar, a fixed-length vector or a ragged bag), optionally "dense" to a
float vector, and batches it into the data contract of `recsys.data`
(`{"categorical": ..., "dense": ...}`, labels `[B]`).

Under a ParameterServerStrategy the dataset is captured into the workers'
dataset function: build it from files (e.g. `tf.data.TFRecordDataset`), not
from large in-memory arrays (gRPC cannot ship them to the workers).

Example:
  >>> source = DatasetSource(ds, feature_config)
  >>> Trainer(model_dir, source=source, model=DLRM, ...)   # or:
  >>> Trainer(model_dir, source=ds, feature_config=feature_config, model=DLRM)
"""

from collections.abc import Mapping
from typing import Any

from recsys import features as features_lib
from recsys._keras import tf
from recsys.data.pipeline import BatchRequest, DataSource


class DatasetSource(DataSource):
  """An unbatched `tf.data.Dataset` and its `FeatureConfig`s as a data source.

  Args:
    dataset: unbatched `(features, label)` elements; `features` a dict with
      one entry per key of `feature_config` (and optionally "dense").
    feature_config: dict feature name -> `tf.tpu.experimental.embedding
      .FeatureConfig`, used as is by the Trainer's embedding backend.
    eval_dataset: the evaluation split (default: `dataset`).
    multi_hot: feature name -> most ids per bag, for ragged bag features.

  Raises:
    ValueError: the dataset is batched already, or lacks a feature of
      `feature_config`.
  """

  def __init__(
    self,
    dataset: tf.data.Dataset,
    feature_config: Mapping[str, Any],
    eval_dataset: tf.data.Dataset | None = None,
    multi_hot: Mapping[str, int] | None = None,
  ):
    self.feature_config = dict(feature_config)
    self.feature_specs = features_lib.specs_from_feature_config(
      self.feature_config, multi_hot
    )
    self._datasets = {
      True: dataset,
      False: eval_dataset if eval_dataset is not None else dataset,
    }
    for ds in self._datasets.values():
      self._check(ds)
    dense = dataset.element_spec[0].get("dense")
    if dense is not None and (dense.shape.rank != 1 or dense.shape[0] is None):
      raise ValueError(
        f'features["dense"] has shape {dense.shape}; expected '
        "a vector of known length per example."
      )
    self.num_dense = int(dense.shape[0]) if dense is not None else 0

  def _check(self, ds: tf.data.Dataset) -> None:
    spec = ds.element_spec
    if not (
      isinstance(spec, tuple)
      and len(spec) == 2
      and isinstance(spec[0], Mapping)
    ):
      raise ValueError(
        f"the dataset's elements are {spec}; expected (features dict, "
        "label) pairs."
      )
    missing = sorted(set(self.feature_config) - set(spec[0]))
    if missing:
      raise ValueError(
        f"the dataset has no features {missing}; it has "
        f"{sorted(spec[0])} and feature_config names "
        f"{sorted(self.feature_config)}."
      )
    label = spec[1]
    if label.shape.rank and (label.shape.rank > 1 or label.shape[0] is None):
      raise ValueError(
        f"labels have shape {label.shape}: the dataset looks "
        "batched already; give it unbatched (the Trainer "
        "batches per replica)."
      )

  def _to_contract(self, features, labels):
    out = {"categorical": {k: features[k] for k in self.feature_config}}
    if "dense" in features:
      out["dense"] = tf.cast(features["dense"], tf.float32)
    return out, tf.reshape(tf.cast(labels, tf.float32), [-1])

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    """Per-replica batches in the data contract (`recsys.data`).

    With several input pipelines, pipeline i reads every n-th element.
    """
    ds = self._datasets[request.training]
    if request.pipelines > 1:
      ds = ds.shard(request.pipelines, request.pipeline)
    if request.repeat:
      ds = ds.repeat()
    ds = ds.batch(request.batch_size, drop_remainder=request.drop_remainder)
    return ds.map(self._to_contract)
