"""Training interactions as a feature: a user's items, an item's users.

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

The mirror image, `ItemHistory`, is the same engine keyed the other way:
an item's training raters as a bag of user ids sharing the user id table,
minus the example's own user (the item-based AutoRec / item-neighbourhood
signal: who rated this item, and how).

Example:
  >>> history = UserHistory(weights="rating", max_length=200)
  >>> source = MovieLens(folder, history=history)  # adds "user_history"
  >>> source = MovieLens(folder, item_history=ItemHistory(weights="rating"))
"""

import dataclasses
from typing import Annotated

import gin
import numpy as np
import tensorflow as tf

from recsys import ranges
from recsys.errors import SettingsError

WEIGHTS = ("none", "rating", "recency")
#: The `weights` and `max_length` parameters, declared (`recsys.ranges`).
Weights = Annotated[str, ranges.Choice(WEIGHTS)]
MaxLength = Annotated[int, ranges.Int(0, note="0: all")]


class UserHistoryConfigError(SettingsError):
  """Inconsistent user-history settings."""


@dataclasses.dataclass(frozen=True)
class HistoryTable:
  """Each key's bag, bags one after the other (row lengths `lengths`).

  Attributes:
    ids: int64 ids (items of a user, or users of an item), each key's bag
      one after the other, newest first.
    weights: float32, aligned with `ids` (None: unweighted).
    lengths: int64 `[num_keys + 1]` bag length of each key id.
  """

  ids: np.ndarray
  weights: np.ndarray | None
  lengths: np.ndarray

  @property
  def max_length(self) -> int:
    return int(self.lengths.max()) if self.lengths.size else 0


class History:
  """How a source builds a history feature: the engine of both directions.

  A history maps a key id (the user of `UserHistory`, the item of
  `ItemHistory`) to the bag of ids it interacted with in the TRAINING
  split. Subclasses fix the direction (`key`, `value`) and the default
  feature name.

  Args:
    weights: "none" (every id weighs 1), "rating" (the rating divided by
      the top of the dataset's rating scale, e.g. 5 for MovieLens; the
      highest training rating where no scale is declared), or "recency"
      (0.5 ** (n / half_life),
      n = how many of the key's interactions are newer).
    max_length: keep each key's newest `max_length` ids (0: all).
    half_life: the recency weights' half-life in interactions.
    feature_name: the feature's name in `features["categorical"]`.
    share_table: embed the bag with the `value` id table (True) or in a
      table of its own (its own regularization; in
      `EmbeddingSettings.overrides` under the feature's name).
  """

  key = "user_id"  # whose bag
  value = "item_id"  # what is in it (the shared table)

  @ranges.checked
  def __init__(
    self,
    weights: Weights = "none",
    max_length: MaxLength = 0,
    half_life: ranges.Positive = 50.0,
    feature_name: ranges.Name = "user_history",
    share_table: ranges.Flag = True,
  ) -> None:
    self.weights = weights
    self.max_length = int(max_length)
    self.half_life = float(half_life)
    self.feature_name = feature_name
    self.share_table = bool(share_table)

  @property
  def weighted(self) -> bool:
    return self.weights != "none"

  @property
  def table(self) -> str | None:
    """The shared embedding table (the `value` feature), or None."""
    return self.value if self.share_table else None

  def build(
    self,
    key: np.ndarray,
    value: np.ndarray,
    rating: np.ndarray,
    timestamp: np.ndarray,
    num_keys: int,
    rating_max: float | None = None,
  ) -> HistoryTable:
    """The bags of keys 0..num_keys from TRAINING interactions only.

    Args:
      key, value: `[N]` encoded ids of the training interactions (user,
        item for a user history; item, user for an item history).
      rating, timestamp: `[N]` of the same interactions.
      num_keys: the largest key id (the table has num_keys + 1 rows).
      rating_max: the top of the dataset's rating scale, which "rating"
        weights divide by (None: the highest rating in `rating`).
    """
    key = np.asarray(key, np.int64)
    # Per key, newest first (ties: later rows first, deterministic).
    order = np.lexsort((-np.arange(len(key)), -np.asarray(timestamp), key))
    key_sorted = key[order]
    starts = np.searchsorted(key_sorted, np.arange(num_keys + 1))
    rank = np.arange(len(order)) - starts[key_sorted]
    keep = (
      rank < self.max_length if self.max_length else np.ones(len(order), bool)
    )
    rows = order[keep]
    lengths = np.bincount(key[rows], minlength=num_keys + 1).astype(np.int64)
    weights = None
    rating = np.asarray(rating, np.float32)
    if rating_max is not None:
      top = float(rating_max)
    else:
      top = max(float(np.max(rating)), 1e-6) if len(rating) else 1.0
    if self.weights == "rating":
      weights = rating[rows] / top
    elif self.weights == "recency":
      weights = (0.5 ** (rank[keep] / self.half_life)).astype(np.float32)
    return HistoryTable(
      np.asarray(value, np.int64)[rows],
      None if weights is None else np.asarray(weights, np.float32),
      lengths[: num_keys + 1],
    )


@gin.register
class UserHistory(History):
  """The "user_history" feature: the user's training items minus the
  example's own, a bag sharing the item id table (SVD++'s implicit term).

  Args:
    weights, max_length, half_life, feature_name: as `History`.
    share_item_table: embed the bag with the item id table (True, the
      default) or in a table of its own.
  """

  key, value = "user_id", "item_id"

  @ranges.checked
  def __init__(
    self,
    weights: Weights = "none",
    max_length: MaxLength = 0,
    half_life: ranges.Positive = 50.0,
    feature_name: ranges.Name = "user_history",
    share_item_table: ranges.Flag = True,
  ) -> None:
    super().__init__(
      weights, max_length, half_life, feature_name, share_item_table
    )

  @property
  def share_item_table(self) -> bool:
    return self.share_table


@gin.register
class ItemHistory(History):
  """The "item_history" feature: the item's training raters minus the
  example's own user, a bag sharing the user id table (item-based AutoRec's
  input; the item-side mirror of SVD++'s implicit term).

  Args:
    weights, max_length, half_life, feature_name: as `History`.
    share_user_table: embed the bag with the user id table (True, the
      default) or in a table of its own.
  """

  key, value = "item_id", "user_id"

  @ranges.checked
  def __init__(
    self,
    weights: Weights = "none",
    max_length: MaxLength = 0,
    half_life: ranges.Positive = 50.0,
    feature_name: ranges.Name = "item_history",
    share_user_table: ranges.Flag = True,
  ) -> None:
    super().__init__(
      weights, max_length, half_life, feature_name, share_user_table
    )


def lookup(
  table: HistoryTable, key: tf.Tensor, exclude: tf.Tensor | None = None
) -> tuple[tf.RaggedTensor, tf.RaggedTensor | None]:
  """The bags `[B, None]` of `key` `[B]`, without `exclude` `[B]`.

  For a user history: the users' items without the example's item; for an
  item history: the items' users without the example's user. A key with an
  empty bag (unknown, or whose only id is excluded) gets `[0]` (the shared
  table's unknown row) with weight 1.

  Returns:
    (ids, weights) RaggedTensors; weights None for an unweighted table.
  """
  key = tf.reshape(tf.cast(key, tf.int64), [-1])
  ids = tf.gather(
    tf.RaggedTensor.from_row_lengths(
      tf.constant(table.ids), tf.constant(table.lengths), validate=False
    ),
    key,
  )
  weights = None
  if table.weights is not None:
    weights = tf.gather(
      tf.RaggedTensor.from_row_lengths(
        tf.constant(table.weights), tf.constant(table.lengths), validate=False
      ),
      key,
    )
  if exclude is not None:
    exclude = tf.reshape(tf.cast(exclude, tf.int64), [-1])
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


__all__ = [
  "History",
  "HistoryTable",
  "ItemHistory",
  "UserHistory",
  "UserHistoryConfigError",
  "lookup",
]
