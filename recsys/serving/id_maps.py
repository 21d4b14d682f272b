"""Raw ids to rows inside an export, in plain TensorFlow.

A table trained dynamic (`EmbeddingPlacement.vocabularies`) takes raw ids:
its export must map them as training did, with no project code where the
SavedModel is served. Each dynamic table's trained index becomes a
`tf.lookup.StaticHashTable` (raw id -> row) saved in the SavedModel; an id
the model never admitted reads the table's default (its unknown row, or
zeros: left out of its bag). A hashed table (`HashedIds`) keeps its hash,
a few integer ops in the graph.

The indices come from the backend that trained them (`Trainer.run`), or,
when the run is restored on the lookup-only export backend (`recsys
export`), from the checkpoint it restored (`for_run`).

Example:
  >>> maps = IdMaps.for_run(run)            # None: no table takes raw ids
  >>> features = maps.rows(features, names)  # before the serving lookup
"""

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from backends import _tf_internal
from backends.vocabulary import HashedIndex, VocabularyStage
from backends.vocabulary.stage import CHECKPOINT_KEY
from recsys import planning


class IdMaps(tf.Module):
  """Per raw-id feature, how its ids become rows in the export.

  Args:
    indices: table name -> its trained index (`VocabularyIndex`) or its
      `HashedIndex`.
    table_of_feature: feature name -> its table's name.
  """

  def __init__(
    self, indices: Mapping[str, Any], table_of_feature: Mapping[str, str]
  ):
    super().__init__(name="id_maps")
    self._features = {f: t for f, t in table_of_feature.items() if t in indices}
    self._defaults: dict[str, int | None] = {}
    self.hashed = {}
    self.tables = {}
    for table, index in indices.items():
      self._defaults[table] = index.default_row
      if isinstance(index, HashedIndex):
        self.hashed[table] = index
        continue
      keys, rows = index.mapping()
      self.tables[table] = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, rows), default_value=-1
      )

  @classmethod
  def for_run(cls, run: Any) -> "IdMaps | None":
    """The id maps of a restored run's tables (None when none takes raw
    ids): the training backend's indices, or the ones its checkpoint holds
    when the run was restored on the export backend."""
    backend = run.backend
    features = {
      path: backend.table_name(feature.table)
      for path, feature in _tf_internal.flatten_with_joined_string_paths(
        backend.feature_config
      )
    }
    indices = backend.dynamic_tables()
    if not indices:
      names = [backend.table_name(t) for t in backend.tables]
      policies = planning.vocabularies_of(run.settings.placement, names)
      if not policies:
        return None
      indices = _restored_indices(run, backend, policies)
    return cls(indices, features)

  def rows(
    self, features: Mapping[str, Any], names: Sequence[str]
  ) -> dict[str, Any]:
    """`features` (the data contract) with the raw ids of `names` made
    rows: unknown ids read the table's unknown row, or are left out of
    their bag (read zeros)."""
    categorical = dict(features["categorical"])
    for name in names:
      table = self._features.get(name)
      if table is None:
        continue
      ids = categorical[name]
      ragged = isinstance(ids, tf.RaggedTensor)
      values = ids.flat_values if ragged else ids
      if table in self.hashed:
        rows = self.hashed[table].lookup(values)
      else:
        rows = self.tables[table].lookup(tf.cast(values, tf.int64))
      rows = tf.reshape(rows, tf.shape(values))
      default = self._defaults[table]
      if default is not None:
        rows = tf.where(rows < 0, tf.constant(default, tf.int64), rows)
        categorical[name] = ids.with_flat_values(rows) if ragged else rows
        continue
      bags = ids.with_flat_values(rows) if ragged else rows[:, None]
      categorical[name] = tf.ragged.boolean_mask(bags, bags >= 0)
    return {**features, "categorical": categorical}


def _restored_indices(
  run: Any, backend: Any, policies: Mapping[str, Any]
) -> dict[str, Any]:
  """The indices of `policies`' tables as the run's newest checkpoint
  holds them (under the embedding's `vocabularies` child)."""
  by_name = {backend.table_name(t): t for t in backend.tables}
  stage = VocabularyStage(
    {name: (by_name[name], policy) for name, policy in policies.items()},
    backend.feature_table_names(),
    backend.strategy,
    lambda name, rows: tf.no_op(),  # read only: nothing is reset
  )
  holder = _tf_internal.AutoTrackable()
  _tf_internal.track_child(holder, stage.trackable(), CHECKPOINT_KEY)
  path = run.checkpoints.latest
  if path is not None:
    tf.train.Checkpoint(embedding=holder).read(path).expect_partial()
  return stage.indices
