"""Synthetic user-item interactions from a planted softmax, best hit rate known.

Users and items have hidden factors `U [num_users, k]`, `V [num_items, k]`
and items a Zipf popularity. Each example picks a user u (Zipf activity) and
then an item from

    p(i | u) = softmax_i( affinity_scale * <U_u, V_i> + popularity_i ).

Side features carry part of the same signal: a user's age bucket is a
quantile of a projection of `U_u`; an item's genres (a weighted-free
multi-hot bag of 1..max_genres) are the genres whose directions best match
`V_i`. Because p(i | u) is known, the best achievable top-k hit rate (rank
items by true affinity) and the popularity baseline's are exact sums
(`best_hit_rate`, `popularity_hit_rate`).

Batches follow the retrieval contract: `features["categorical"]` holds the
query features (user_id, user_age) and the candidate features (item_id,
item_genres), `features["candidate_sampling_probability"]` the marginal
probability of the item (for log-Q correction), labels are ones.
Examples are pure functions of `(seed, split, index)` as in
`recsys.data.synthetic_ctr`.
"""

import functools
from typing import Annotated

import gin
import numpy as np
import tensorflow as tf

from recsys import ranges
from recsys.data import _random
from recsys.data.pipeline import Batch, IndexedSource, candidate_batches
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

_MAX_TABLE = 1 << 24


class SyntheticRetrievalConfigError(SettingsError):
  """Inconsistent synthetic retrieval settings."""


def _zipf_probs(
  n: int, exponent: float, rng: np.random.Generator
) -> np.ndarray:
  """Zipf probabilities over n entries, assigned to entries in random order."""
  p = (np.arange(1, n + 1, dtype=np.float64)) ** (-exponent)
  p /= p.sum()
  return p[rng.permutation(n)]


@gin.register
class SyntheticRetrieval(IndexedSource):
  """(user, item) interactions from a planted softmax; best hit rate known.

  Example:
    >>> source = SyntheticRetrieval(num_users=500, num_items=300)
    >>> features, labels = next(iter(source.dataset(128)))
    >>> features["categorical"]["item_genres"].shape
    TensorShape([128, None])
    >>> source.best_hit_rate(10), source.popularity_hit_rate(10)

  Attributes:
    feature_specs: user_id, user_age, item_id, item_genres.
    query_features: ["user_id", "user_age"].
    candidate_features: ["item_id", "item_genres"].
    candidate_id_feature: "item_id".
    num_dense: 0.
  """

  query_features: list[str] = ["user_id", "user_age"]
  candidate_features: list[str] = ["item_id", "item_genres"]
  candidate_id_feature: str = "item_id"

  config_error = SyntheticRetrievalConfigError

  @ranges.checked
  def __init__(
    self,
    num_users: ranges.PositiveInt = 2000,
    num_items: Annotated[int, ranges.Int(2)] = 1000,
    factor_dim: ranges.PositiveInt = 8,
    affinity_scale: ranges.NonNegative = 2.0,
    popularity_exponent: ranges.NonNegative = 0.8,
    user_activity_exponent: ranges.NonNegative = 0.5,
    num_age_buckets: ranges.PositiveInt = 7,
    num_genres: ranges.PositiveInt = 18,
    max_genres: ranges.PositiveInt = 3,
    num_examples: ranges.PositiveInt | None = None,
    num_eval_examples: ranges.PositiveInt = 1 << 14,
    seed: ranges.Seed = 0,
  ):
    """Plants users, items and their affinities.

    Args:
      num_users: users (ids in [0, num_users)).
      num_items: items, i.e. the candidate corpus (ids in [0, num_items)).
      factor_dim: k, dimension of the hidden user and item factors.
      affinity_scale: inverse temperature of the softmax over items: larger
        makes interactions more predictable from the user.
      popularity_exponent: Zipf exponent of item popularity (0: none).
      user_activity_exponent: Zipf exponent of how often each user appears.
      num_age_buckets: vocabulary of user_age.
      num_genres: vocabulary of item_genres.
      max_genres: most genres per item (each item has 1..max_genres).
      num_examples: training interactions (None: infinite).
      num_eval_examples: interactions in the evaluation split.
      seed: everything is a function of the seed.

    Raises:
      SyntheticRetrievalConfigError: sizes out of range.
    """
    if num_users < 1 or num_items < 2:
      raise SyntheticRetrievalConfigError(
        f"need num_users >= 1 and num_items >= 2, got {num_users} and "
        f"{num_items}."
      )
    if num_users * num_items > _MAX_TABLE:
      raise SyntheticRetrievalConfigError(
        f"num_users * num_items = {num_users * num_items} exceeds "
        f"{_MAX_TABLE}: the "
        "generator keeps the exact [users, items] softmax; use fewer users or "
        "items."
      )
    if not 1 <= max_genres <= num_genres:
      raise SyntheticRetrievalConfigError(
        f"max_genres must be in [1, num_genres={num_genres}], got {max_genres}."
      )
    self.num_users, self.num_items = int(num_users), int(num_items)
    self.num_examples = num_examples
    self.num_eval_examples = int(num_eval_examples)
    self.seed = int(seed)
    self.num_dense = 0
    self.feature_specs = [
      FeatureSpec("user_id", self.num_users),
      FeatureSpec("user_age", int(num_age_buckets)),
      FeatureSpec("item_id", self.num_items),
      FeatureSpec(
        "item_genres",
        int(num_genres),
        multi_hot=max_genres > 1,
        max_ids=int(max_genres),
      ),
    ]

    rng = np.random.default_rng([self.seed, 11])
    k = int(factor_dim)
    users = rng.standard_normal((num_users, k)) / np.sqrt(k)
    items = rng.standard_normal((num_items, k))
    popularity = np.log(_zipf_probs(num_items, popularity_exponent, rng))
    logits = affinity_scale * users @ items.T + popularity[None, :]  # [U, I]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    self._probs = probs  # p(i | u)
    self._user_probs = _zipf_probs(num_users, user_activity_exponent, rng)
    self._item_marginal = self._user_probs @ probs  # q(i)
    self._affinity = logits

    # Side features that carry part of the signal.
    projection = users @ rng.standard_normal(k)
    edges = np.quantile(
      projection, np.linspace(0, 1, num_age_buckets + 1)[1:-1]
    )
    self._user_age = np.searchsorted(edges, projection).astype(np.int64)
    genre_dirs = rng.standard_normal((num_genres, k))
    order = np.argsort(-(items @ genre_dirs.T), axis=1)  # [I, G]
    lengths = rng.integers(1, max_genres + 1, size=num_items)
    self._genres = [
      order[i, : lengths[i]].astype(np.int64) for i in range(num_items)
    ]

    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    self._item_cdf = cdf.astype(np.float32).ravel()
    user_cdf = np.cumsum(self._user_probs)
    self._user_cdf = (user_cdf / user_cdf[-1]).astype(np.float32)

  # ---------------------------------------------------------------- features

  def _genre_table(self) -> tf.RaggedTensor:
    return tf.RaggedTensor.from_row_lengths(
      np.concatenate(self._genres),
      [len(g) for g in self._genres],
      validate=False,
    ).with_row_splits_dtype(tf.int64)

  def _item_features(self, item: tf.Tensor) -> dict[str, tf.Tensor]:
    genres = tf.gather(self._genre_table(), item)
    if not self.feature_specs[3].multi_hot:
      genres = genres.flat_values
    return {"item_id": item, "item_genres": genres}

  def _sample_items(self, user: tf.Tensor, u: tf.Tensor) -> tf.Tensor:
    """Inverse-CDF sampling of p(. | user) by binary search, int64 `[N]`."""
    cdf = tf.constant(self._item_cdf)
    base = user * self.num_items
    lo = tf.zeros_like(user)
    hi = tf.fill(tf.shape(user), tf.constant(self.num_items - 1, tf.int64))
    for _ in range(int(np.ceil(np.log2(self.num_items))) + 1):
      mid = (lo + hi) // 2
      go_right = tf.gather(cdf, base + mid) <= u
      lo = tf.where(go_right, mid + 1, lo)
      hi = tf.where(go_right, hi, mid)
    return tf.minimum(lo, self.num_items - 1)

  def _batch(self, index: tf.Tensor, stream: str) -> Batch:
    key = functools.partial(_random.make_key, self.seed, stream)
    u_user = _random.uniform([key("user")], index)
    user = tf.searchsorted(
      tf.constant(self._user_cdf), u_user, side="right", out_type=tf.int64
    )
    user = tf.minimum(user, self.num_users - 1)
    item = self._sample_items(user, _random.uniform([key("item")], index))
    categorical = {"user_id": user, "user_age": tf.gather(self._user_age, user)}
    categorical.update(self._item_features(item))
    features = {
      "categorical": categorical,
      "candidate_sampling_probability": tf.gather(
        tf.constant(self._item_marginal, tf.float32), item
      ),
    }
    return features, tf.ones(tf.shape(index), tf.float32)

  def examples(self, index: tf.Tensor, training: bool = True) -> Batch:
    """`(features, labels)` of the interactions at given indices (int64 [N])."""
    return self._batch(
      tf.convert_to_tensor(index, tf.int64), "train" if training else "eval"
    )

  def candidates(self, batch_size: int) -> tf.data.Dataset:
    """Every item once, as `{"categorical": {item_id, item_genres}}` batches."""
    return candidate_batches(
      range(self.num_items), self._item_features, batch_size
    )

  # ---------------------------------------------------------------- optimum

  def true_affinities(self, user_ids) -> np.ndarray:
    """The planted log-affinities (up to a per-user constant) [N, num_items]."""
    return self._affinity[np.asarray(user_ids)]

  def item_probabilities(self) -> np.ndarray:
    """The marginal probability of each item in an interaction, [num_items]."""
    return self._item_marginal.copy()

  def known_optimum(self, ks: tuple[int, ...] = ()) -> dict[str, float]:
    """`best_hit_rate_<k>` and `popularity_hit_rate_<k>` for each k."""
    out = {}
    for k in ks:
      out[f"best_hit_rate_{k}"] = self.best_hit_rate(k)
      out[f"popularity_hit_rate_{k}"] = self.popularity_hit_rate(k)
    return out

  def best_hit_rate(self, k: int) -> float:
    """Expected top-k hit rate of the Bayes ranking (items by p(i | u)).

    sum_u P(u) * (sum of the k largest p(i | u)): the best any retrieval
    model can reach when scoring the whole corpus.
    """
    k = min(int(k), self.num_items)
    top = -np.partition(-self._probs, k - 1, axis=1)[:, :k]
    return float(self._user_probs @ top.sum(axis=1))

  def popularity_hit_rate(self, k: int) -> float:
    """Expected top-k hit rate of the k most popular items for everyone."""
    k = min(int(k), self.num_items)
    return float(np.sort(self._item_marginal)[::-1][:k].sum())
