"""A user's training interactions as a feature: a weighted bag of item ids.

The pattern for any source with user histories: build a `HistoryTable` once
from the TRAINING interactions only (never from held-out ones), then for
each example gather its user's bag and drop the example's own item, so a
training example never sees its label's item in its features. The bag
shares the item id table (`FeatureSpec(..., table=<item id feature>)`), so
it is the "implicit feedback" term of SVD++ / the "watch history" input of
YouTube's two-tower model; the item table's combiner ("mean" or "sqrtn",
`EmbeddingSettings.combiner` or its per-table override) pools it.

At serving time the bag is derived from the raw user id alone (the user's
training history, a snapshot taken when the source was built), minus the
scored item when there is one: no extra raw input is needed.

Example:
  >>> history = UserHistory(weights="rating", max_length=200)
  >>> source = MovieLens(folder, history=history)  # adds "user_history"
"""

import dataclasses

import gin
import numpy as np
import tensorflow as tf

WEIGHTS = ("none", "rating", "recency")


class UserHistoryConfigError(ValueError):
  """Inconsistent user-history settings."""


@dataclasses.dataclass(frozen=True)
class HistoryTable:
  """Each user's bag: `ids[offsets[u]:offsets[u + 1]]` (and its weights).

  Attributes:
    ids: int64 item ids, users' bags one after the other, newest first.
    weights: float32, aligned with `ids` (None: unweighted).
    lengths: int64 `[num_users + 1]` bag length of each user id.
  """

  ids: np.ndarray
  weights: np.ndarray | None
  lengths: np.ndarray

  @property
  def max_length(self) -> int:
    return int(self.lengths.max()) if self.lengths.size else 0


@gin.register
class UserHistory:
  """How a source builds the "user_history" feature.

  Args:
    weights: "none" (every item weighs 1), "rating" (the rating divided by
      the highest training rating), or "recency" (0.5 ** (n / half_life),
      n = how many of the user's interactions are newer).
    max_length: keep each user's newest `max_length` items (0: all).
    half_life: the recency weights' half-life in interactions.
    feature_name: the feature's name in `features["categorical"]`.
    share_item_table: embed the bag with the item id table (True, the
      default) or in a table of its own (its own regularization; in
      `EmbeddingSettings.overrides` under the feature's name).
  """

  def __init__(
    self,
    weights: str = "none",
    max_length: int = 0,
    half_life: float = 50.0,
    feature_name: str = "user_history",
    share_item_table: bool = True,
  ) -> None:
    if weights not in WEIGHTS:
      raise UserHistoryConfigError(
        f"UserHistory: unknown weights {weights!r}; valid: "
        f"{', '.join(WEIGHTS)}."
      )
    if max_length < 0 or half_life <= 0:
      raise UserHistoryConfigError(
        f"UserHistory: max_length must be >= 0 and half_life > 0, got "
        f"{max_length} and {half_life}."
      )
    self.weights = weights
    self.max_length = int(max_length)
    self.half_life = float(half_life)
    self.feature_name = feature_name
    self.share_item_table = bool(share_item_table)

  @property
  def weighted(self) -> bool:
    return self.weights != "none"

  def build(
    self,
    user: np.ndarray,
    item: np.ndarray,
    rating: np.ndarray,
    timestamp: np.ndarray,
    num_users: int,
  ) -> HistoryTable:
    """The bags of users 0..num_users from TRAINING interactions only.

    Args:
      user, item: `[N]` encoded ids of the training interactions.
      rating, timestamp: `[N]` of the same interactions.
      num_users: the largest user id (the table has num_users + 1 rows).
    """
    user = np.asarray(user, np.int64)
    # Per user, newest first (ties: later rows first, deterministic).
    order = np.lexsort((-np.arange(len(user)), -np.asarray(timestamp), user))
    user_sorted = user[order]
    starts = np.searchsorted(user_sorted, np.arange(num_users + 1))
    rank = np.arange(len(order)) - starts[user_sorted]
    keep = (
      rank < self.max_length if self.max_length else np.ones(len(order), bool)
    )
    rows = order[keep]
    lengths = np.bincount(user[rows], minlength=num_users + 1).astype(np.int64)
    weights = None
    if self.weights == "rating":
      top = float(np.max(rating)) if len(rating) else 1.0
      weights = np.asarray(rating, np.float32)[rows] / max(top, 1e-6)
    elif self.weights == "recency":
      weights = (0.5 ** (rank[keep] / self.half_life)).astype(np.float32)
    return HistoryTable(
      np.asarray(item, np.int64)[rows],
      None if weights is None else np.asarray(weights, np.float32),
      lengths[: num_users + 1],
    )


def lookup(
  table: HistoryTable, user: tf.Tensor, exclude_item: tf.Tensor | None = None
) -> tuple[tf.RaggedTensor, tf.RaggedTensor | None]:
  """The bags `[B, None]` of `user` `[B]`, without `exclude_item` `[B]`.

  A user with an empty bag (unknown, or whose only item is excluded) gets
  `[0]` (the item table's unknown row) with weight 1.

  Returns:
    (ids, weights) RaggedTensors; weights None for an unweighted table.
  """
  user = tf.reshape(tf.cast(user, tf.int64), [-1])
  ids = tf.gather(
    tf.RaggedTensor.from_row_lengths(
      tf.constant(table.ids), tf.constant(table.lengths), validate=False
    ),
    user,
  )
  weights = None
  if table.weights is not None:
    weights = tf.gather(
      tf.RaggedTensor.from_row_lengths(
        tf.constant(table.weights), tf.constant(table.lengths), validate=False
      ),
      user,
    )
  if exclude_item is not None:
    exclude = tf.reshape(tf.cast(exclude_item, tf.int64), [-1])
    keep = ids.with_flat_values(
      tf.not_equal(ids.flat_values, tf.gather(exclude, ids.value_rowids()))
    )
    ids = tf.ragged.boolean_mask(ids, keep)
    if weights is not None:
      weights = tf.ragged.boolean_mask(weights, keep)
  empty = tf.cast(tf.equal(ids.row_lengths(), 0), tf.int64)
  pad_ids = tf.RaggedTensor.from_row_lengths(
    tf.zeros([tf.reduce_sum(empty)], tf.int64), empty, validate=False
  )
  ids = tf.concat([ids, pad_ids], axis=1)
  if weights is not None:
    pad_w = tf.RaggedTensor.from_row_lengths(
      tf.ones([tf.reduce_sum(empty)], tf.float32), empty, validate=False
    )
    weights = tf.concat([weights, pad_w], axis=1)
  return ids, weights


__all__ = ["HistoryTable", "UserHistory", "UserHistoryConfigError", "lookup"]
