"""MovieLens raw ids -> model inputs: one transformation, reader and serving.

`MovieLens` builds its vocabularies and side-feature tables once from the
files (NumPy), then encodes every rating through `MovieLensRawParser`: raw
user and item ids (strings, surrounding whitespace ignored as the reader
ignores it) become contiguous ids by vocabulary lookup, timestamps (int64
seconds) become quantile buckets of the training timestamps, and the user's
side features (age, gender, occupation, zip prefix) and the item's genres
are gathered by those ids. The export's raw signature runs the same parser
on the ids a client sends.

Out of vocabulary: a user or item id that was not in the files maps to id
0, which is also what its side features become (unknown age, gender, ...,
genres `[0]`). Training never sees id 0 for user_id or item_id, so its
embedding row holds its initial values. The same holds for a user or item
that is in the files but only in the test split: its id is real, its row
untrained. `unknown()` flags both (an id whose row training never updated)
and the export returns the flags next to the scores.

Raw ids (`raw_ids="integer"` or `"fingerprint"`, `MovieLens.raw_ids`): the
user_id and item_id features are the raw ids of `movielens.raw_ids` (the
files' integer ids, or token fingerprints) instead of contiguous ids; the
side features and histories still gather by the contiguous ids behind
them. Serving computes the raw id of whatever id a client sends, one in the
files or not (a dynamic table decides what it knows).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from recsys.data import user_history
from recsys.data.movielens import raw_ids as movielens_raw_ids
from recsys.data.raw import RawParser

USER_SIDE_FEATURES = ("user_age", "user_gender", "user_occupation", "user_zip")
ITEM_SIDE_FEATURES = ("item_genres", "item_year", "item_title")
HISTORY_FEATURE = "user_history"
ITEM_HISTORY_FEATURE = "item_history"


def _vocabulary_table(values: Sequence[str]) -> tf.lookup.StaticHashTable:
  """Raw id -> its line in `values` + 1; anything else -> 0."""
  with tf.init_scope():
    return tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
        tf.constant(list(values), tf.string),
        tf.range(1, len(values) + 1, dtype=tf.int64),
      ),
      default_value=0,
    )


class MovieLensRawParser(RawParser):
  """Raw MovieLens ids -> `features["categorical"]`.

  Args:
    user_vocab, item_vocab: raw ids in id order (id i + 1 for entry i).
    user_side: feature name -> int64 `[num_users + 1]`, the side-feature id
      of each user id (row 0: unknown user).
    genre_values, genre_lengths: the genre bag of each item id (row 0: `[0]`).
    timestamp_edges: ascending float64 bucket edges; bucket = 1 + the number
      of edges <= the timestamp. None: no timestamp feature.
    item_side: feature name -> int64 `[num_items + 1]` one-hot item features
      (item_year).
    item_bags: feature name -> (values, lengths) multi-hot item features
      besides the genres (item_title); row 0 `[0]`.
    history: the users' training histories ("user_history": the user's bag
      minus the example's item, see `recsys.data.user_history`); derived
      from the raw user id, so serving needs no extra input.
    item_history: the items' training raters ("item_history": the item's
      bag of user ids minus the example's user); derived from the raw item
      id.
    trained_users, trained_items: bool `[num_users + 1]` / `[num_items + 1]`,
      True for the ids whose embedding row training updates (None: every id
      but 0).
    raw_ids: None: user_id / item_id are the contiguous ids; "integer" or
      "fingerprint": they are the raw ids of that kind
      (`recsys.data.movielens.raw_ids`).

  Example:
    >>> parser.parse_raw({"user_id": tf.constant(["196"]),
    ...                   "item_id": tf.constant(["242"])},
    ...                  ["user_id", "item_id"])
    {'categorical': {'user_id': <[1] int64>, 'item_id': <[1] int64>}}
  """

  def __init__(
    self,
    user_vocab: Sequence[str],
    item_vocab: Sequence[str],
    user_side: Mapping[str, np.ndarray],
    genre_values: np.ndarray,
    genre_lengths: np.ndarray,
    timestamp_edges: np.ndarray | None = None,
    item_side: Mapping[str, np.ndarray] | None = None,
    item_bags: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    history: user_history.HistoryTable | None = None,
    item_history: user_history.HistoryTable | None = None,
    trained_users: np.ndarray | None = None,
    trained_items: np.ndarray | None = None,
    raw_ids: str | None = None,
  ):
    super().__init__(name="movielens_raw_parser")
    self.raw_id_kind = raw_ids
    # Contiguous id -> raw id (row 0, unknown, never delivered: 0).
    self._raw_of: dict[str, np.ndarray] = {}
    if raw_ids is not None:
      with tf.init_scope():
        for name, vocab in (("user_id", user_vocab), ("item_id", item_vocab)):
          ids = movielens_raw_ids.raw_ids(list(vocab), raw_ids).numpy()
          self._raw_of[name] = np.concatenate([[0], ids]).astype(np.int64)
    self._trained = {
      name: None if mask is None else np.asarray(mask, bool)
      for name, mask in (
        ("user_id", trained_users),
        ("item_id", trained_items),
      )
    }
    self.user_table = _vocabulary_table(user_vocab)
    self.item_table = _vocabulary_table(item_vocab)
    self._vocab = {
      "user_id": np.array([""] + list(user_vocab), dtype=object),
      "item_id": np.array([""] + list(item_vocab), dtype=object),
    }
    self._user_side = {k: np.asarray(v, np.int64) for k, v in user_side.items()}
    self._item_side = {
      k: np.asarray(v, np.int64) for k, v in (item_side or {}).items()
    }
    self._bags = {
      "item_genres": (
        np.asarray(genre_values, np.int64),
        np.asarray(genre_lengths, np.int64),
      )
    }
    for name, (values, lengths) in (item_bags or {}).items():
      self._bags[name] = (
        np.asarray(values, np.int64),
        np.asarray(lengths, np.int64),
      )
    self._history = history
    self._item_history = item_history
    self._edges = (
      None
      if timestamp_edges is None
      else np.asarray(timestamp_edges, np.float64)
    )

  # -- the pieces the reader uses -------------------------------------------

  def user_index(self, user: Any) -> tf.Tensor:
    """Raw user ids (string `[B]`) -> int64 ids `[B]`, 0 if unknown."""
    return self.user_table.lookup(
      tf.strings.strip(tf.convert_to_tensor(user, tf.string))
    )

  def item_index(self, item: Any) -> tf.Tensor:
    """Raw item ids (string `[B]`) -> int64 ids `[B]`, 0 if unknown."""
    return self.item_table.lookup(
      tf.strings.strip(tf.convert_to_tensor(item, tf.string))
    )

  def timestamp_bucket(self, timestamp: Any) -> tf.Tensor:
    """Seconds (int64 `[B]`) -> bucket ids 1..len(edges) + 1 `[B]`."""
    if self._edges is None:
      raise ValueError(
        "this MovieLens source has no timestamp feature "
        "(timestamp_buckets = 0)."
      )
    seconds = tf.cast(tf.convert_to_tensor(timestamp, tf.int64), tf.float64)
    if not self._edges.size:
      return tf.ones_like(seconds, tf.int64)
    return 1 + tf.searchsorted(
      tf.constant(self._edges), seconds, side="right", out_type=tf.int64
    )

  def categorical(
    self,
    feature_names: Sequence[str],
    user: tf.Tensor | None = None,
    item: tf.Tensor | None = None,
    stamp: tf.Tensor | None = None,
  ) -> dict[str, tf.Tensor]:
    """`features["categorical"]` of `feature_names` from encoded ids `[B]`.

    Args:
      feature_names: the features to build, in this order.
      user, item: int64 user / item ids (needed by user_* / item_* features).
      stamp: int64 timestamp buckets (needed by "timestamp").
    """
    return self.features(feature_names, user, item, stamp)["categorical"]

  def features(
    self,
    feature_names: Sequence[str],
    user: tf.Tensor | None = None,
    item: tf.Tensor | None = None,
    stamp: tf.Tensor | None = None,
    raw: Mapping[str, tf.Tensor] | None = None,
  ) -> dict[str, Any]:
    """`{"categorical": ..., ["weights": ...]}` of `feature_names`.

    Like `categorical`, plus the weights of a weighted "user_history" /
    "item_history". The user history drops `item` from each row's bag when
    `item` is given; the item history drops `user` when it is given. With
    raw ids, user_id / item_id are `raw[name]` where given (serving: the
    raw id of the id sent), else the raw id of the contiguous id.
    """
    out, weights = {}, {}
    histories = {  # name: (table, whose bag, the id it leaves out)
      name: (table, key, exclude)
      for name, table, key, exclude in (
        (HISTORY_FEATURE, self._history, user, item),
        (ITEM_HISTORY_FEATURE, self._item_history, item, user),
      )
      if table is not None
    }
    id_of = {"user_id": user, "item_id": item}
    for name in feature_names:
      if name in id_of:
        out[name] = self._delivered_id(name, id_of[name], raw)
      elif name in USER_SIDE_FEATURES:
        out[name] = tf.gather(self._user_side[name], user)
      elif name in self._item_side:
        out[name] = tf.gather(self._item_side[name], item)
      elif name in self._bags:
        values, lengths = self._bags[name]
        bags = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
        out[name] = tf.gather(bags, item)
      elif name in histories:
        table, key, exclude = histories[name]
        ids, w = user_history.lookup(table, key, exclude)
        out[name] = ids
        if w is not None:
          weights[name] = w
      elif name == "timestamp":
        out[name] = stamp
      else:
        raise KeyError(f"MovieLens has no feature {name!r}.")
    result: dict[str, Any] = {"categorical": out}
    if weights:
      result["weights"] = weights
    return result

  def _delivered_id(
    self,
    name: str,
    ids: tf.Tensor | None,
    raw: Mapping[str, tf.Tensor] | None,
  ) -> tf.Tensor | None:
    """user_id / item_id as delivered: the contiguous ids, or raw ids."""
    if self.raw_id_kind is None:
      return ids
    if raw is not None and name in raw:
      return raw[name]
    return tf.gather(self._raw_of[name], ids)

  # -- RawParser --------------------------------------------------------------

  def raw_feature_spec(
    self, feature_names: Sequence[str], dense: bool = False
  ) -> dict[str, tf.TensorSpec]:
    """user_id / item_id string `[B]`, timestamp int64 `[B]`, as names need."""
    del dense  # MovieLens has no dense features
    spec = {}
    if any(
      n in ("user_id", HISTORY_FEATURE) or n in USER_SIDE_FEATURES
      for n in feature_names
    ):
      spec["user_id"] = tf.TensorSpec([None], tf.string, "user_id")
    if any(
      n in ("item_id", ITEM_HISTORY_FEATURE) or n in ITEM_SIDE_FEATURES
      for n in feature_names
    ):
      spec["item_id"] = tf.TensorSpec([None], tf.string, "item_id")
    if "timestamp" in feature_names:
      spec["timestamp"] = tf.TensorSpec([None], tf.int64, "timestamp")
    return spec

  def parse_raw(
    self, raw: Mapping[str, tf.Tensor], feature_names: Sequence[str]
  ) -> dict[str, Any]:
    """Raw `user_id`, `item_id`, `timestamp` -> `{"categorical": ...}`.

    "user_history" comes from the raw user id (its training history, minus
    the raw item when one is given), "item_history" from the raw item id
    (minus the raw user); a weighted one adds `"weights"`. With raw ids,
    user_id / item_id are the raw ids of the ids sent (an "integer" parser
    fails on one that is not a decimal int64).
    """
    user = self.user_index(raw["user_id"]) if "user_id" in raw else None
    item = self.item_index(raw["item_id"]) if "item_id" in raw else None
    stamp = (
      self.timestamp_bucket(raw["timestamp"]) if "timestamp" in raw else None
    )
    sent = None
    if self.raw_id_kind is not None:
      sent = {
        name: movielens_raw_ids.raw_ids(raw[name], self.raw_id_kind)
        for name in ("user_id", "item_id")
        if name in raw
      }
    return self.features(feature_names, user, item, stamp, sent)

  def unknown(self, raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """user_id / item_id -> True where training never updated the id's row:
    the raw id is not in the files (id 0), or only in the test split."""
    out = {}
    for name, index in (
      ("user_id", self.user_index),
      ("item_id", self.item_index),
    ):
      if name not in raw:
        continue
      ids = index(raw[name])
      trained = self._trained[name]
      if trained is None:
        out[name] = tf.equal(ids, 0)
      else:
        out[name] = tf.logical_not(tf.gather(tf.constant(trained), ids))
    return out

  def raw_ids(self, feature_name: str, ids: tf.Tensor) -> tf.Tensor | None:
    """user_id or item_id ids -> the raw ids (id 0 -> "")."""
    vocab = self._vocab.get(feature_name)
    if vocab is None:
      return None
    return tf.gather(tf.constant(vocab.astype(str), tf.string), ids)


__all__ = ["MovieLensRawParser"]
