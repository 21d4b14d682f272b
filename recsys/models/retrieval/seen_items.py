"""What each user has already seen: the candidates `exclude_seen` leaves out.

Production retrieval does not return the items a user already consumed, and
the field's standard offline protocol (e.g. RecBole's full ranking) ranks
only the others. `SeenItems` holds each query id's TRAINING candidates, in
the engine of the history feature (`recsys.data.user_history.HistoryTable`,
built by `UserHistory` from the training interactions only), and turns a
batch of query ids into an exclusion matrix `[B, E]` (-1 padded) for
`CorpusIndex.query_with_exclusions`, TFRS's `TopK.query_with_exclusions`
(`BruteForce`, `ScaNN`) and the corpus hit rates (`CorpusHitRates`). The
example's own positive is never excluded.

Evaluation passes it to the model as `features["seen_candidate_ids"]`
(`with_seen`); the export looks it up from the raw user id.

Example:
  >>> seen = SeenItems.from_source(source)      # the training split's pairs
  >>> seen.padded(tf.constant([3, 7]), positives=tf.constant([12, 5]))
  <tf.Tensor: shape=(2, E), dtype=int64>          # -1 padded
  >>> index.query_with_exclusions(queries, seen.padded(user_ids))
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from recsys.data import user_history
from recsys.models.errors import ModelConfigError

#: The batch feature that carries each example's seen candidates `[B, E]`.
SEEN_FEATURE = "seen_candidate_ids"


class SeenItems:
  """Each query id's training candidate ids (a `HistoryTable`).

  Args:
    table: bags of candidate ids keyed by query id (row i: query id i).
  """

  def __init__(self, table: user_history.HistoryTable) -> None:
    self.table = table
    self._ids = tf.constant(table.ids, tf.int64)
    self._lengths = tf.constant(table.lengths, tf.int64)

  @classmethod
  def from_pairs(
    cls, query_ids: Any, candidate_ids: Any, num_queries: int | None = None
  ) -> "SeenItems":
    """From the training interactions `(query id, candidate id)`, `[N]` each.

    Args:
      query_ids, candidate_ids: integer arrays of the same length.
      num_queries: the query id vocabulary (default: the largest id + 1).

    Raises:
      ModelConfigError: lengths differ or an id is negative.
    """
    queries = np.asarray(query_ids, np.int64).reshape(-1)
    candidates = np.asarray(candidate_ids, np.int64).reshape(-1)
    if queries.shape != candidates.shape:
      raise ModelConfigError(
        f"SeenItems: {queries.size} query ids but {candidates.size} "
        "candidate ids; give one of each per training interaction."
      )
    if queries.size and min(queries.min(), candidates.min()) < 0:
      raise ModelConfigError("SeenItems: ids must be >= 0.")
    if num_queries is None:
      num_queries = int(queries.max()) + 1 if queries.size else 1
    # The history feature's engine: every pair (no cap), unweighted; the
    # same item seen twice is listed once.
    pairs = np.unique(np.stack([queries, candidates], 1), axis=0)
    table = user_history.UserHistory().build(
      pairs[:, 0],
      pairs[:, 1],
      np.ones(len(pairs), np.float32),
      np.zeros(len(pairs), np.int64),
      num_queries - 1,
    )
    return cls(table)

  @classmethod
  def from_source(
    cls,
    source: Any,
    query_id_feature: str | None = None,
    batch_size: int = 8192,
  ) -> "SeenItems":
    """The training split of a retrieval source, read once (or its
    `training_pairs()`, where it has them: `recsys.data.ials_source`).

    Args:
      source: a retrieval `DataSource` with a finite training split.
      query_id_feature: the one-hot query id (default: `query_id_feature(
        source)`).
      batch_size: examples read at once.

    Raises:
      ModelConfigError: no query id feature, or an endless training split.
    """
    name = query_id_feature or query_id_feature_of(source)
    vocab = {s.name: s.vocabulary_size for s in source.feature_specs}
    pairs = getattr(source, "training_pairs", None)
    if callable(pairs):  # a source whose batches are not (query, candidate)
      queries, candidates = pairs()
      return cls.from_pairs(queries, candidates, vocab.get(name))
    candidate = source.candidate_id_feature
    dataset = source.dataset(
      batch_size, training=True, repeat=False, drop_remainder=False
    )
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
      raise ModelConfigError(
        f"exclude_seen: the training split of {type(source).__name__} is "
        "endless, so what each user has seen is undefined; give the source "
        "a finite training split (e.g. num_examples) or leave exclude_seen "
        "off."
      )
    queries, candidates = [], []
    for features, _ in dataset:
      categorical = features["categorical"]
      queries.append(np.reshape(categorical[name].numpy(), [-1]))
      candidates.append(np.reshape(categorical[candidate].numpy(), [-1]))
    return cls.from_pairs(
      np.concatenate(queries), np.concatenate(candidates), vocab.get(name)
    )

  @property
  def max_seen(self) -> int:
    """E: the most candidates any query id has seen (at least 1)."""
    return max(self.table.max_length, 1)

  def lookup(
    self, query_ids: tf.Tensor, positives: tf.Tensor | None = None
  ) -> tf.RaggedTensor:
    """The seen candidates `[B, None]` of `query_ids` `[B]`, minus each row's
    positive (if given). Ids outside the table see nothing."""
    query_ids = tf.reshape(tf.cast(query_ids, tf.int64), [-1])
    rows = tf.shape(self._lengths, out_type=tf.int64)[0]
    known = tf.logical_and(query_ids >= 0, query_ids < rows)
    bags = tf.RaggedTensor.from_row_lengths(
      self._ids, self._lengths, validate=False
    )
    seen = tf.gather(bags, tf.where(known, query_ids, 0))
    keep = tf.gather(known, seen.value_rowids())
    if positives is not None:
      positives = tf.reshape(tf.cast(positives, tf.int64), [-1])
      keep &= tf.not_equal(
        seen.flat_values, tf.gather(positives, seen.value_rowids())
      )
    return tf.ragged.boolean_mask(seen, seen.with_flat_values(keep))

  def padded(
    self, query_ids: tf.Tensor, positives: tf.Tensor | None = None
  ) -> tf.Tensor:
    """`lookup` as int64 `[B, max_seen]`, -1 padded (a static width)."""
    seen = self.lookup(query_ids, positives)
    return seen.to_tensor(default_value=-1, shape=[None, self.max_seen])


def exclusions_of(features: Mapping[str, Any]) -> tf.Tensor | None:
  """The batch's seen candidates `[B, E]` (-1 padded) that a query's
  ranking leaves out (None: the batch carries none; nothing is excluded)."""
  return features.get(SEEN_FEATURE)


def query_id_feature_of(source: Any) -> str:
  """The query id feature seen items are keyed by.

  The source's `query_id_feature` if it has one, else "user_id" when it is
  a query feature (MovieLens, SyntheticRetrieval).

  Raises:
    ModelConfigError: neither.
  """
  name = getattr(source, "query_id_feature", None)
  if name:
    return name
  if "user_id" in getattr(source, "query_features", ()):
    return "user_id"
  raise ModelConfigError(
    f"exclude_seen: {type(source).__name__} names no query id feature "
    "(no `query_id_feature` attribute, no 'user_id' among its query "
    f"features {list(getattr(source, 'query_features', []))}); give the "
    "source a `query_id_feature`."
  )


def with_seen(
  features: Mapping[str, Any],
  seen: SeenItems,
  query_id_feature: str,
  candidate_id_feature: str,
) -> dict[str, Any]:
  """`features` plus `features[SEEN_FEATURE]`: each row's seen candidates
  `[B, max_seen]`, minus its own positive (for evaluation batches)."""
  categorical = features["categorical"]
  out = dict(features)
  out[SEEN_FEATURE] = seen.padded(
    categorical[query_id_feature], categorical[candidate_id_feature]
  )
  return out


__all__ = [
  "SEEN_FEATURE",
  "SeenItems",
  "exclusions_of",
  "query_id_feature_of",
  "with_seen",
]
