"""A retrieval source's training pairs as implicit ALS's alternating halves.

`ImplicitALSData` wraps a retrieval source (MovieLens with task
"retrieval", ...): its training split becomes the batches of
`recsys.data.ials_batches` (the item Gramian, every user row with its
items, the user Gramian, every item row with its users, epoch after epoch;
planned once, built by tf.data), while evaluation, the candidate
corpus, the raw-id parser and the files stay the wrapped source's, so a run
of `recsys.models.retrieval.ials.ImplicitALS` is evaluated and exported
like any retrieval run. Each evaluation batch gains the iALS features,
empty.

Example (gin):
  train.data = @ImplicitALSData()
  ImplicitALSData.source = @MovieLens()
  ImplicitALSData.batch_size = 256   # = train.global_batch_size / replicas
"""

from typing import Any

import gin
import numpy as np

from recsys import ranges
from recsys._keras import tf
from recsys.data import ials_batches, ials_dataset, ials_plan
from recsys.data.pipeline import BatchRequest, DataSource, check_batch_size
from recsys.errors import SettingsError

_RAGGED = (ials_batches.USER_HISTORY, ials_batches.ITEM_HISTORY)


class ImplicitALSDataError(SettingsError):
  """Settings under which the iALS halves cannot be delivered."""


def _empty_ragged(rows: tf.Tensor) -> tf.RaggedTensor:
  return tf.RaggedTensor.from_row_lengths(
    tf.zeros([0], tf.int64), tf.zeros([rows], tf.int64)
  )


@gin.register
class ImplicitALSData(DataSource):
  """iALS training batches from a retrieval source's training pairs.

  Attributes:
    feature_specs: the wrapped source's query and candidate id features and
      the iALS features (`ials_batches.feature_specs`).
    query_features, candidate_features: the two id features, one each.
    candidate_id_feature, query_id_feature: those ids.
    num_users, num_items: the tables' rows (the id vocabularies).
  """

  @ranges.checked
  def __init__(
    self,
    source: Any,
    batch_size: ranges.PositiveInt,
    steps_multiple: ranges.PositiveInt = 1,
    history_chunk: ranges.PositiveInt | None = None,
  ) -> None:
    """Reads the wrapped source's training pairs once.

    Args:
      source: a retrieval source with a finite training split and
        `query_features`, `candidate_id_feature`.
      batch_size: rows per replica and step: train.global_batch_size
        divided by the replicas.
      steps_multiple: pad each half's Gramian and solve batches to a
        multiple of this many batches; set it to the number of replicas,
        so no step mixes kinds of batch (the model refuses a mixed step).
      history_chunk: cut histories longer than this many ids into chunks
        (a batch entry each; `recsys.data.ials_batches`): batches are padded
        to the chunk instead of the longest history; a row needing more
        chunks than a batch holds is solved in steps of its own. None: no
        cut.

    Raises:
      ImplicitALSDataError: no query id feature, or an endless training
        split.
      HistoryChunkError: history_chunk is no number of ids.
    """
    self.source = source
    self.batch_size = check_batch_size(batch_size)
    self.steps_multiple = check_batch_size(steps_multiple)
    ials_batches.check_history_chunk(history_chunk)  # before the read
    self.history_chunk = history_chunk
    user = getattr(source, "query_id_feature", None) or "user_id"
    if user not in getattr(source, "query_features", ()):
      raise ImplicitALSDataError(
        f"ImplicitALSData: {type(source).__name__} has no query id feature "
        f"{user!r} among its query features "
        f"{list(getattr(source, 'query_features', []))}."
      )
    item = source.candidate_id_feature
    self.query_id_feature = user
    self.query_features = [user]
    self.candidate_features = [item]
    self.candidate_id_feature = item
    self.num_dense = 0
    self.num_users = source.spec(user).vocabulary_size
    self.num_items = source.spec(item).vocabulary_size
    self._pairs = self._read_pairs()
    self.feature_specs = ials_batches.feature_specs(
      self._pairs, self.num_users, self.num_items, user, item, history_chunk
    )
    # Every epoch is the same: planned once, built by tf.data each time.
    self._plan = ials_plan.plan_epoch(
      self._pairs,
      self.num_users,
      self.num_items,
      self.batch_size,
      self.steps_multiple,
      self.history_chunk,
    )

  def _read_pairs(self) -> np.ndarray:
    dataset = self.source.dataset(
      8192, training=True, repeat=False, drop_remainder=False
    )
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
      raise ImplicitALSDataError(
        f"ImplicitALSData: the training split of {type(self.source).__name__}"
        " is endless; iALS solves every row from its whole history."
      )
    users, items = [], []
    for features, _ in dataset:
      categorical = features["categorical"]
      users.append(np.reshape(categorical[self.query_id_feature], [-1]))
      items.append(np.reshape(categorical[self.candidate_id_feature], [-1]))
    return np.stack([np.concatenate(users), np.concatenate(items)], 1)

  def training_pairs(self) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, candidate ids) of the training split (seen items)."""
    return self._pairs[:, 0], self._pairs[:, 1]

  def steps_per_epoch(self) -> int:
    """Batches of one epoch: both halves, their Gramian batches too (an
    epoch is `steps_per_epoch() / replicas` steps)."""
    return self._plan.num_batches

  def _with_empty_ials_features(self, features, labels):
    features = dict(features)
    categorical = dict(features["categorical"])
    rows = tf.shape(categorical[self.candidate_id_feature])[0]
    for name in _RAGGED:
      categorical[name] = _empty_ragged(rows)
    features["categorical"] = categorical
    features[ials_batches.SIDE] = tf.fill([rows], ials_batches.PADDING)
    features[ials_batches.COUNTS] = tf.zeros([rows], tf.int64)
    features[ials_batches.SEGMENT] = tf.range(rows, dtype=tf.int32)
    return features, labels

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    """Training: the iALS halves (`batch_size` equal to
    `ImplicitALSData.batch_size`; input pipeline p of P takes the batches
    of its replicas, `ials_dataset.pipeline_batches`); evaluation: the
    wrapped source's batches with the iALS features empty.

    Raises:
      ImplicitALSDataError: training with another batch size.
      PipelinesError: steps_multiple is no multiple of the pipelines.
    """
    if not request.training:
      context = None
      if request.pipelines > 1:
        context = tf.distribute.InputContext(
          num_input_pipelines=request.pipelines,
          input_pipeline_id=request.pipeline,
        )
      base = self.source.dataset(
        request.batch_size,
        training=False,
        input_context=context,
        drop_remainder=request.drop_remainder,
        repeat=request.repeat,
      )
      return base.map(
        tf.autograph.experimental.do_not_convert(self._with_empty_ials_features)
      )
    if request.batch_size != self.batch_size:
      raise ImplicitALSDataError(
        f"ImplicitALSData: training batches of {request.batch_size} rows per "
        f"replica asked, but ImplicitALSData.batch_size = {self.batch_size}; "
        "set it to train.global_batch_size divided by the replicas."
      )
    batches = ials_dataset.epoch_dataset(
      self._plan,
      self.query_id_feature,
      self.candidate_id_feature,
      request.pipeline,
      request.pipelines,
      self.steps_multiple,
    )
    return batches.repeat() if request.repeat else batches

  def candidates(self, batch_size: int) -> tf.data.Dataset:
    """The wrapped source's candidate corpus."""
    return self.source.candidates(batch_size)

  def raw_parser(self) -> Any:
    """The wrapped source's raw-id parser (serving by raw ids)."""
    return self.source.raw_parser()

  def input_files(self) -> list[str]:
    """The wrapped source's files."""
    return self.source.input_files()
