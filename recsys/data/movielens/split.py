"""MovieLens' split step: which ratings are test, and which are examples.

"random" takes a seeded permutation's first `test_fraction` of the ratings,
"temporal" the latest by timestamp (of equal ones, the later line), and
"files" the split the files give (`split_files`), as given. The
split is a mask over the ratings read, so every later step (histories from
training ratings only, timestamp buckets, the batches) reads the same one.

Example:
  >>> ratings = split_ratings(raw, "random", 0.2, seed=0)
  >>> raw.user[ratings.rows("test")]
"""

import dataclasses
import logging

import numpy as np

from recsys.data.errors import DataFormatError
from recsys.data.movielens.files import RawMovieLens

log = logging.getLogger("recsys.data.movielens")


@dataclasses.dataclass(frozen=True)
class RatingSplit:
  """The split of the ratings read.

  Attributes:
    is_test: `[N]` bool, the test ratings (the rest train, and feed the
      histories).
    keep: `[N]` bool, the ratings that are examples (retrieval: those
      >= min_rating; ranking: all).
  """

  is_test: np.ndarray
  keep: np.ndarray

  @property
  def is_train(self) -> np.ndarray:
    return ~self.is_test

  def rows(self, name: str) -> np.ndarray:
    """Indices of the examples of split `name` ("train" or "test")."""
    mask = self.is_test if name == "test" else self.is_train
    return np.flatnonzero(mask & self.keep)


def split_ratings(
  raw: RawMovieLens,
  split: str,
  test_fraction: float,
  seed: int,
  file_is_test: np.ndarray | None = None,
  min_rating: float | None = None,
) -> RatingSplit:
  """The ratings' split by `split` ("random", "temporal" or "files").

  Args:
    raw: the ratings read.
    split: the protocol; "files" takes `file_is_test` as given.
    test_fraction: share of ratings in the test split (random, temporal).
    seed: the random split's seed.
    file_is_test: the files' split (split="files").
    min_rating: examples are the ratings >= min_rating (None: all, ranking).
  """
  n = len(raw.user)
  if file_is_test is not None:
    is_test = np.asarray(file_is_test, bool)
  else:
    if split == "random":
      order = np.random.default_rng([seed, 3]).permutation(n)
    else:  # newest first; of equal timestamps, the later line
      order = np.lexsort((np.arange(n), raw.timestamp))[::-1]
    is_test = np.zeros(n, bool)
    is_test[order[: int(round(test_fraction * n))]] = True
  keep = (
    raw.rating >= min_rating if min_rating is not None else np.ones(n, bool)
  )
  return RatingSplit(is_test, keep)


def timestamp_edges(
  timestamps: np.ndarray, ratings: RatingSplit, buckets: int
) -> np.ndarray | None:
  """The quantile edges of the training timestamps (None: no buckets)."""
  if buckets <= 0:
    return None
  return np.quantile(
    timestamps[ratings.is_train], np.linspace(0, 1, buckets + 1)[1:-1]
  )


def check_split(
  raw: RawMovieLens,
  user: np.ndarray,
  item: np.ndarray,
  is_test: np.ndarray,
  split: str,
  policy: str,
) -> None:
  """Warns about (or refuses) (user, item) pairs in both splits or twice.

  MovieLens has one rating per user and item: a pair of the test split that
  is also in the training split means the evaluation scores a rating the
  model trained on, and a pair twice in one split counts one rating twice.

  Raises:
    DataFormatError: such pairs with policy "strict" (counts them, names
      the first leaked one's file and line).
  """
  key = user.astype(np.int64) * (int(item.max(initial=0)) + 1) + item
  train_keys, test_keys = key[~is_test], key[is_test]
  leaked = np.isin(test_keys, train_keys)
  counts = {
    "test ratings whose (user, item) pair is also a training rating": int(
      leaked.sum()
    ),
    "training ratings that repeat a training (user, item) pair": int(
      len(train_keys) - len(np.unique(train_keys))
    ),
    "test ratings that repeat a test (user, item) pair": int(
      len(test_keys) - len(np.unique(test_keys))
    ),
  }
  if not any(counts.values()):
    return
  files = raw.origins.paths if raw.origins is not None else [raw.source]
  where = ""
  if leaked.any() and raw.origins is not None:
    first = int(np.flatnonzero(is_test)[np.argmax(leaked)])
    where = (
      f" (the first test one: user {raw.user[first]!r}, item "
      f"{raw.item[first]!r} at {raw.origins.where(first)})"
    )
  listed = "; ".join(f"{n} {what}" for what, n in counts.items() if n)
  message = (
    f"MovieLens split {split!r} of {', '.join(files)}: {listed}{where}. "
    "The evaluation then scores ratings the model trained on, or counts "
    "a rating twice; MovieLens has one rating per user and item."
  )
  if policy == "strict":
    raise DataFormatError(
      message + " Fix the files (each pair once, in one split), or set "
      "MovieLens.split_check = 'warn' to use them as given."
    )
  log.warning(
    "%s Used as given; MovieLens.split_check = 'strict' refuses them.", message
  )


__all__ = ["RatingSplit", "check_split", "split_ratings", "timestamp_edges"]
