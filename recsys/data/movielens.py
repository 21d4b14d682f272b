"""MovieLens as a data source: ratings (ranking), user-item pairs (retrieval).

Reads a local folder (`recsys.data.movielens_files`: GroupLens ml-100k,
ml-1m, or RecBole atomic files), maps raw ids to contiguous ids (0 is
reserved for unknown/out-of-vocabulary everywhere), splits deterministically
(random with a seed, or temporal: the latest `test_fraction` of ratings by
timestamp), and serves batches from memory.

Categorical features (all int64 `[B]` except item_genres, a RaggedTensor
`[B, None]`):

  user_id, item_id       contiguous ids, raw ids sorted (numerically if numeric)
  user_age               1..7: <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+
                         (ml-1m groups)
  user_gender            1 = M, 2 = F
  user_occupation        occupations sorted by name -> 1..n
  user_zip               the first `zip_prefix_length` characters, sorted
                         -> 1..n
  item_genres            genres sorted by name -> 1..n (0: an item without one)
  timestamp              (only if timestamp_buckets > 0) quantile bucket of the
                         training timestamps, 1..timestamp_buckets

Opt-in (name them in `features`, or pass `history`):

  item_year              release year, years sorted -> 1..n (0: unknown)
  item_title             title tokens (lower-case words of the title without
                         its year, in >= title_min_count titles), sorted ->
                         1..n; RaggedTensor `[B, None]` ([0]: none)
  user_history           the user's TRAINING items minus the example's own
                         item, RaggedTensor `[B, None]` sharing the item_id
                         table (`recsys.data.user_history`); weighted
                         (`features["weights"]`) with UserHistory.weights
  item_history           (ranking) the item's TRAINING raters minus the
                         example's own user, RaggedTensor `[B, None]`
                         sharing the user_id table (`ItemHistory`); weighted
                         with ItemHistory.weights

Ranking (`task="ranking"`): labels are the ratings. Retrieval
(`task="retrieval"`): one example per rating >= `min_rating`, labels ones,
plus `features["candidate_sampling_probability"]` (the item's share of the
training interactions) and `candidates()` over the whole corpus.
"""

import logging
import os
import re
from collections.abc import Sequence

import gin
import numpy as np
import tensorflow as tf

from recsys.data import movielens_files, movielens_split_files
from recsys.data.movielens_raw import MovieLensRawParser
from recsys.data.pipeline import (
  AUTOTUNE,
  Batch,
  BatchRequest,
  DataSource,
  candidate_batches,
)
from recsys.data.user_history import ItemHistory, UserHistory
from recsys.errors import RecsysError
from recsys.feature_spec import FeatureSpec

log = logging.getLogger("recsys.data.movielens")

AGE_BOUNDARIES = (18, 25, 35, 45, 50, 56)
QUERY_FEATURES = (
  "user_id",
  "user_age",
  "user_gender",
  "user_occupation",
  "user_zip",
  "timestamp",
)
CANDIDATE_FEATURES = ("item_id", "item_genres", "item_year", "item_title")
HISTORY_FEATURE = "user_history"
ITEM_HISTORY_FEATURE = "item_history"
ALL_FEATURES = (
  QUERY_FEATURES
  + (HISTORY_FEATURE,)
  + CANDIDATE_FEATURES
  + (ITEM_HISTORY_FEATURE,)
)
# Delivered only when asked for (features=..., history=..., item_history=...).
OPT_IN_FEATURES = (
  "item_year",
  "item_title",
  HISTORY_FEATURE,
  ITEM_HISTORY_FEATURE,
)
VARIANTS = ("ml-100k", "ml-1m", "atomic")
TASKS = ("ranking", "retrieval")
SPLITS = ("random", "temporal", "files")
SPLIT_CHECKS = ("warn", "strict")


class MovieLensConfigError(RecsysError, ValueError):
  """Inconsistent MovieLens settings."""


def _sorted_vocab(values) -> list[str]:
  values = sorted(set(values))
  if values and all(v.isdigit() for v in values):
    values.sort(key=int)
  return values


def title_tokens(title: str) -> list[str]:
  """Lower-case words: "Usual Suspects, The" -> [usual, suspects, the]."""
  return re.findall(r"[a-z0-9]+", title.lower())


def _age_bucket(age: str) -> int:
  try:
    value = float(age)
  except ValueError:
    return 0
  return 1 + int(np.searchsorted(AGE_BOUNDARIES, value, side="right"))


def _rating_scale(
  scale: Sequence[float] | str | None, variant: str
) -> tuple[float, float] | None:
  """`(lowest, highest)` of `rating_scale` ("auto": the layout's)."""
  if scale is None:
    return None
  if isinstance(scale, str):
    if scale != "auto":
      raise MovieLensConfigError(
        f"MovieLens rating_scale {scale!r}: give (lowest, highest), "
        "'auto' or None."
      )
    return movielens_files.RATING_SCALES[variant]
  values = tuple(float(v) for v in scale)
  if len(values) != 2 or not values[0] <= values[1]:
    raise MovieLensConfigError(
      f"MovieLens rating_scale must be (lowest, highest) with lowest <= "
      f"highest, got {scale!r}."
    )
  return values[0], values[1]


def _check_split(
  raw: movielens_files.RawMovieLens,
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
    raise movielens_files.DataFormatError(
      message + " Fix the files (each pair once, in one split), or set "
      "MovieLens.split_check = 'warn' to use them as given."
    )
  log.warning(
    "%s Used as given; MovieLens.split_check = 'strict' refuses them.", message
  )


@gin.register
class MovieLens(DataSource):
  """MovieLens ratings (ranking) or interactions (retrieval) from a folder.

  Example:
    >>> source = MovieLens("/data/ml-100k", variant="ml-100k", task="retrieval")
    >>> features, labels = next(iter(source.dataset(256)))
    >>> features["categorical"]["item_genres"].shape
    TensorShape([256, None])
    >>> corpus = source.candidates(1024)

  Attributes:
    feature_specs: the selected features (see module docstring).
    num_dense: 0.
    query_features, candidate_features: names in `features["categorical"]`.
    candidate_id_feature: "item_id".
    num_users, num_items: distinct users and items (vocabularies: one more).
    train_size, test_size: examples in each split.
  """

  candidate_id_feature: str = "item_id"

  def __init__(
    self,
    data_dir: str,
    variant: str = "auto",
    task: str = "ranking",
    split: str = "random",
    test_fraction: float = 0.2,
    seed: int = 0,
    features: Sequence[str] | None = None,
    min_rating: float = 0.0,
    zip_prefix_length: int = 2,
    timestamp_buckets: int = 0,
    dataset_name: str | None = None,
    download: bool = False,
    shuffle: bool = True,
    fold: str = "u1",
    history: UserHistory | None = None,
    title_min_count: int = 2,
    item_history: ItemHistory | None = None,
    rating_scale: Sequence[float] | str | None = "auto",
    split_check: str = "warn",
  ):
    """Reads, encodes and splits the data.

    Args:
      data_dir: folder with the files (or with a `<variant>/` subfolder).
      variant: "ml-100k", "ml-1m", "atomic" (RecBole files), or "auto":
        detected from the files (`*.inter` -> atomic, `u.data` -> ml-100k,
        `ratings.dat` -> ml-1m; ml-100k to download when there are none).
      task: "ranking" (labels = ratings) or "retrieval" (labels = ones).
      split: "random" (seeded), "temporal" (test = latest ratings) or
        "files": a fixed split given as files, used as given
        (`recsys.data.movielens_split_files`: ml-100k's `<fold>.base` /
        `<fold>.test`, RecBole's `<name>.train.inter` / `<name>.test.inter`).
      test_fraction: share of ratings in the test split (not with "files").
      seed: split and shuffle seed.
      features: categorical features to deliver (default: all available; see
        module docstring); user_id and item_id are always included.
      min_rating: retrieval keeps ratings >= min_rating as interactions.
      zip_prefix_length: characters of the zip code kept.
      timestamp_buckets: > 0 adds a "timestamp" feature of that many buckets.
      dataset_name: the atomic file stem (`<name>.inter`); default: the one.
      download: fetch a missing GroupLens variant (`tf.keras.utils.get_file`).
      shuffle: shuffle training examples (seeded, reshuffled each epoch).
      fold: with split="files" on ml-100k, GroupLens' fold: u1 ... u5, ua, ub.
      history: adds the "user_history" feature built this way from the
        training split (None: no history feature unless `features` names
        it, which uses `UserHistory()`).
      title_min_count: item_title keeps words in at least this many titles.
      item_history: adds the "item_history" feature (ranking only) built
        this way from the training split (None: none unless `features`
        names it, which uses `ItemHistory()`).
      rating_scale: `(lowest, highest)` rating of the dataset: every rating
        read is checked against it (file and line of one outside), and
        rating-weighted histories divide by `highest`. "auto": the scale
        the layout declares (`movielens_files.RATING_SCALES`: 1-5 for
        ml-100k and ml-1m, 0.5-5 for atomic files); None: no check, and
        weights divide by the highest training rating.
      split_check: what a (user, item) pair rated in both splits, or twice
        in one, does: "warn" (logs the counts) or "strict" (refused with
        the counts, `DataFormatError`). Such a pair means the evaluation
        scores ratings the model trained on, or counts one rating twice.

    Raises:
      MovieLensConfigError: unknown variant/task/split/feature, bad fraction.
      DatasetNotFoundError: the folder or files are missing.
      DataFormatError: a file does not parse, or a rating is off the scale
        (names file and line); the splits overlap (split_check="strict").
    """
    if variant == "auto":
      detected = movielens_files.detect_variant(data_dir, dataset_name)
      # A missing folder or a file as data_dir: read()'s errors say so.
      if detected is None and not download and os.path.isdir(data_dir):
        raise movielens_files.DatasetNotFoundError(
          "MovieLens variant='auto': no MovieLens files in "
          f"{data_dir!r} (nor a "
          "subfolder named after the variant); expected RecBole atomic files "
          "(<name>.inter), ml-100k's u.data, u.item, u.user or ml-1m's "
          "ratings.dat, movies.dat, users.dat. Check MovieLens.data_dir / "
          "MOVIELENS_DIR, or set MovieLens.download = True for ml-100k."
        )
      variant = detected or "ml-100k"
    for value, valid, what in (
      (variant, VARIANTS, "variant"),
      (task, TASKS, "task"),
      (split, SPLITS, "split"),
      (split_check, SPLIT_CHECKS, "split_check"),
    ):
      if value not in valid:
        raise MovieLensConfigError(
          f"unknown MovieLens {what} {value!r}; valid: {', '.join(valid)}."
        )
    if not 0.0 <= test_fraction < 1.0:
      raise MovieLensConfigError(
        f"test_fraction must be in [0, 1), got {test_fraction}."
      )
    self.variant, self.task, self.split = variant, task, split
    self._test_fraction, self._min_rating = test_fraction, min_rating
    self.seed, self.shuffle = int(seed), bool(shuffle)
    self.num_dense = 0
    file_is_test = None
    if split == "files":
      raw, file_is_test = movielens_split_files.read(
        data_dir, variant, dataset_name, fold
      )
    else:
      raw = movielens_files.read(
        data_dir, variant, dataset_name, allow_download=download
      )
    self.source_folder = raw.source
    self._files = list(raw.files)
    self.rating_scale = _rating_scale(rating_scale, variant)
    if self.rating_scale is not None:
      movielens_files.check_rating_scale(raw, self.rating_scale, variant)

    # Vocabularies over every id in the files (an id map, not a statistic).
    user_vocab = _sorted_vocab(list(raw.user) + list(raw.users))
    item_vocab = _sorted_vocab(list(raw.item) + list(raw.items))
    self.num_users, self.num_items = len(user_vocab), len(item_vocab)
    side = {
      name: np.zeros(self.num_users + 1, np.int64)
      for name in QUERY_FEATURES[1:5]
    }
    occupations = _sorted_vocab(
      u["occupation"] for u in raw.users.values() if u["occupation"]
    )
    zips = _sorted_vocab(
      u["zip"][:zip_prefix_length] for u in raw.users.values() if u["zip"]
    )
    occ_index = {v: i + 1 for i, v in enumerate(occupations)}
    zip_index = {v: i + 1 for i, v in enumerate(zips)}
    user_index = {v: i + 1 for i, v in enumerate(user_vocab)}
    for uid, info in raw.users.items():
      row = user_index[uid]
      side["user_age"][row] = _age_bucket(info["age"])
      side["user_gender"][row] = {"M": 1, "F": 2}.get(info["gender"].upper(), 0)
      side["user_occupation"][row] = occ_index.get(info["occupation"], 0)
      side["user_zip"][row] = zip_index.get(info["zip"][:zip_prefix_length], 0)
    self.genres = _sorted_vocab(g for gs in raw.items.values() for g in gs)
    genre_index = {g: i + 1 for i, g in enumerate(self.genres)}
    item_index = {v: i + 1 for i, v in enumerate(item_vocab)}
    bags: list[list[int]] = [[0] for _ in range(self.num_items + 1)]
    for iid, names in raw.items.items():
      ids = sorted(genre_index[g] for g in set(names))
      bags[item_index[iid]] = ids or [0]
    genre_values = np.concatenate([np.array(b, np.int64) for b in bags])
    genre_lengths = np.array([len(b) for b in bags], np.int64)
    item_info = raw.item_info
    years = _sorted_vocab(v["year"] for v in item_info.values() if v["year"])
    year_index = {v: i + 1 for i, v in enumerate(years)}
    item_year = np.zeros(self.num_items + 1, np.int64)
    words = {
      iid: sorted(set(title_tokens(v["title"]))) for iid, v in item_info.items()
    }
    word_counts: dict[str, int] = {}
    for ws in words.values():
      for w in ws:
        word_counts[w] = word_counts.get(w, 0) + 1
    self.title_vocab = sorted(
      w for w, c in word_counts.items() if c >= max(int(title_min_count), 1)
    )
    word_index = {w: i + 1 for i, w in enumerate(self.title_vocab)}
    title_bags: list[list[int]] = [[0] for _ in range(self.num_items + 1)]
    for iid, v in item_info.items():
      if iid not in item_index:
        continue
      item_year[item_index[iid]] = year_index.get(v["year"], 0)
      ids = [word_index[w] for w in words[iid] if w in word_index]
      title_bags[item_index[iid]] = ids or [0]
    title_values = np.concatenate([np.array(b, np.int64) for b in title_bags])
    title_lengths = np.array([len(b) for b in title_bags], np.int64)
    vocab_sizes = {
      "user_id": self.num_users + 1,
      "item_id": self.num_items + 1,
      "user_age": len(AGE_BOUNDARIES) + 2,
      "user_gender": 3,
      "user_occupation": len(occupations) + 1,
      "user_zip": len(zips) + 1,
      "item_genres": len(self.genres) + 1,
      "timestamp": int(timestamp_buckets) + 1,
      "item_year": len(years) + 1,
      "item_title": len(self.title_vocab) + 1,
      HISTORY_FEATURE: self.num_items + 1,
      ITEM_HISTORY_FEATURE: self.num_users + 1,
    }

    # Which features.
    available = ["user_id", "item_id", "item_genres"]
    if raw.users:
      available += ["user_age", "user_gender", "user_occupation", "user_zip"]
    if timestamp_buckets > 0:
      available.append("timestamp")
    if item_info:  # even with no year or word in 2 titles (ids 0)
      available += ["item_year", "item_title"]
    available.append(HISTORY_FEATURE)
    if task == "ranking":  # candidates() would need its weights: not yet
      available.append(ITEM_HISTORY_FEATURE)
    elif item_history is not None:
      raise MovieLensConfigError(
        f"MovieLens item_history is for task='ranking' only, got task={task!r}."
      )
    if features is None:
      chosen = [
        f
        for f in ALL_FEATURES
        if f in available
        and (
          f not in OPT_IN_FEATURES
          or (f == HISTORY_FEATURE and history)
          or (f == ITEM_HISTORY_FEATURE and item_history)
        )
      ]
    else:
      if history is not None:
        features = list(features) + [HISTORY_FEATURE]
      if item_history is not None:
        features = list(features) + [ITEM_HISTORY_FEATURE]
      unknown = [f for f in features if f not in available]
      if unknown:
        raise MovieLensConfigError(
          f"MovieLens {variant} in {raw.source!r} has no feature(s) {unknown}; "
          f"available: {', '.join(available)}."
        )
      chosen = [
        f for f in ALL_FEATURES if f in set(features) | {"user_id", "item_id"}
      ]
    self._chosen = chosen
    if HISTORY_FEATURE in chosen and history is None:
      history = UserHistory()
    self.history = history if HISTORY_FEATURE in chosen else None
    if ITEM_HISTORY_FEATURE in chosen and item_history is None:
      item_history = ItemHistory()
    self.item_history = item_history if ITEM_HISTORY_FEATURE in chosen else None
    self.query_features = [
      f for f in chosen if f in QUERY_FEATURES or f == HISTORY_FEATURE
    ]
    self.candidate_features = [
      f for f in chosen if f in CANDIDATE_FEATURES + (ITEM_HISTORY_FEATURE,)
    ]

    # Split.
    n = len(raw.user)
    num_test = int(round(test_fraction * n))
    if split == "random":
      order = np.random.default_rng([self.seed, 3]).permutation(n)
    else:
      order = np.lexsort((np.arange(n), raw.timestamp))[::-1]  # newest first
    is_test = np.zeros(n, bool)
    is_test[order[:num_test]] = True
    if file_is_test is not None:  # the split the files give, as given
      is_test = file_is_test
    keep = raw.rating >= min_rating if task == "retrieval" else np.ones(n, bool)
    edges = None
    if timestamp_buckets > 0:
      train_ts = raw.timestamp[~is_test]
      edges = np.quantile(
        train_ts, np.linspace(0, 1, timestamp_buckets + 1)[1:-1]
      )

    # Every rating is encoded by the parser that the export's raw signature
    # runs too: training and serving map raw ids the same way.
    encoder = MovieLensRawParser(
      user_vocab, item_vocab, side, genre_values, genre_lengths
    )
    user = encoder.user_index(raw.user).numpy()
    item = encoder.item_index(raw.item).numpy()
    train_rows = ~is_test  # the histories: training ratings only, never test
    columns = {"user_id": user[train_rows], "item_id": item[train_rows]}

    def history_table(history, num_keys: int):
      if history is None:
        return None
      return history.build(
        columns[history.key],
        columns[history.value],
        raw.rating[train_rows],
        raw.timestamp[train_rows],
        num_keys,
        rating_max=self.rating_scale[1] if self.rating_scale else None,
      )

    table = history_table(self.history, self.num_users)
    item_table = history_table(self.item_history, self.num_items)
    _check_split(raw, user, item, is_test, split, split_check)
    # The ids whose embedding rows training updates: those of training
    # examples, and those in a history bag that shares their table.
    examples = train_rows & keep
    trained = {
      "user_id": np.bincount(user[examples], minlength=self.num_users + 1),
      "item_id": np.bincount(item[examples], minlength=self.num_items + 1),
    }
    for h, t in ((self.history, table), (self.item_history, item_table)):
      if h is not None and t is not None and h.table is not None:
        trained[h.table] = trained[h.table] + np.bincount(
          t.ids, minlength=len(trained[h.table])
        )
    self._raw = MovieLensRawParser(
      user_vocab,
      item_vocab,
      side,
      genre_values,
      genre_lengths,
      edges,
      item_side={"item_year": item_year},
      item_bags={"item_title": (title_values, title_lengths)},
      history=table,
      item_history=item_table,
      trained_users=trained["user_id"][: self.num_users + 1] > 0,
      trained_items=trained["item_id"][: self.num_items + 1] > 0,
    )
    histories = {
      HISTORY_FEATURE: (self.history, table),
      ITEM_HISTORY_FEATURE: (self.item_history, item_table),
    }
    max_ids = {
      "item_genres": int(genre_lengths.max()),
      "item_title": int(title_lengths.max()),
      **{
        name: max(t.max_length, 1) if t is not None else 1
        for name, (_, t) in histories.items()
      },
    }
    built = {n: h for n, (h, _) in histories.items() if h is not None}
    self.feature_specs = [
      FeatureSpec(
        name,
        vocab_sizes[name],
        multi_hot=name in max_ids,
        max_ids=max_ids.get(name, 1),
        weighted=name in built and built[name].weighted,
        table=built[name].table if name in built else None,
      )
      for name in chosen
    ]
    stamp = (
      self._raw.timestamp_bucket(raw.timestamp).numpy()
      if edges is not None
      else np.zeros(n, np.int64)
    )
    self._splits = {}
    for name, mask in (("train", ~is_test & keep), ("test", is_test & keep)):
      rows = np.flatnonzero(mask)
      self._splits[name] = (
        user[rows],
        item[rows],
        raw.rating[rows],
        stamp[rows],
      )
    self.train_size = len(self._splits["train"][0])
    self.test_size = len(self._splits["test"][0])
    counts = np.bincount(self._splits["train"][1], minlength=self.num_items + 1)
    self._item_probability = (counts / max(counts.sum(), 1)).astype(np.float32)
    log.info(
      "MovieLens %s from %s: %d users, %d items, %d ratings; "
      "%s split %d train / %d test",
      variant,
      raw.source,
      self.num_users,
      self.num_items,
      n,
      split,
      self.train_size,
      self.test_size,
    )

  # ----------------------------------------------------------------- batches

  def input_files(self) -> list[str]:
    """The ratings and metadata files read (fingerprinted with a run)."""
    return list(self._files)

  def raw_parser(self) -> MovieLensRawParser:
    """The raw ids -> features transformation the reader uses (for serving)."""
    return self._raw

  def _item_features(self, item: tf.Tensor) -> dict[str, tf.Tensor]:
    return self._raw.categorical(self.candidate_features, item=item)

  def _lookup(self, user, item, rating, stamp) -> Batch:
    features = self._raw.features(self._chosen, user, item, stamp)
    if self.task == "retrieval":
      features["candidate_sampling_probability"] = tf.gather(
        self._item_probability, item
      )
      return features, tf.ones(tf.shape(user), tf.float32)
    return features, rating

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    """Batches of the train (or test) split, for `DataSource.dataset`.

    Input pipeline p of P takes examples p, p+P, ... of the split. Training
    batches are drawn from a seeded permutation, reshuffled every epoch;
    batching happens on indices, so the per-example cost is a gather.

    Raises:
      MovieLensConfigError: a repeated split gives this input pipeline no batch.
    """
    size, training, pipeline = (
      request.batch_size,
      request.training,
      request.pipeline,
    )
    drop_remainder, repeat = request.drop_remainder, request.repeat
    if not training and not self.test_size:
      raise MovieLensConfigError(self._empty_test_message())
    arrays = self._splits["train" if training else "test"]
    rows = np.arange(pipeline, len(arrays[0]), request.pipelines)
    arrays = tuple(tf.constant(a[rows]) for a in arrays)
    n = len(rows)
    shuffle = training and self.shuffle
    full = (n // size) * size
    if repeat and (full if drop_remainder else n) == 0:
      raise MovieLensConfigError(
        f"the {'train' if training else 'test'} split of input pipeline "
        f"{pipeline} has {n} examples, fewer than one batch of {size}: use a "
        "smaller batch size, "
        "a larger test_fraction, or drop_remainder=False."
      )

    def epoch(e):
      if shuffle:
        noise = tf.random.stateless_uniform(
          [n], seed=tf.stack([np.int64(self.seed), e])
        )
        order = tf.argsort(noise)
      else:
        order = tf.range(n)
      batches = tf.data.Dataset.from_tensor_slices(
        tf.reshape(order[:full], [-1, size])
      )
      if not drop_remainder and full < n:
        batches = batches.concatenate(
          tf.data.Dataset.from_tensors(order[full:])
        )
      return batches

    epochs = tf.data.Dataset.range(1 << 40 if repeat else 1)
    ds = epochs.flat_map(tf.autograph.experimental.do_not_convert(epoch))
    lookup = tf.autograph.experimental.do_not_convert(
      lambda index: self._lookup(*(tf.gather(a, index) for a in arrays))
    )
    return ds.map(lookup, num_parallel_calls=AUTOTUNE)

  def _empty_test_message(self) -> str:
    """Why the test split has no example, and the setting that fixes it."""
    if self.split == "files":
      why = "the test file holds no rating"
    elif self._test_fraction == 0:
      why = "MovieLens.test_fraction = 0.0 keeps every rating for training"
    else:
      why = (
        f"MovieLens.test_fraction = {self._test_fraction} leaves no test rating"
      )
    if self.task == "retrieval":
      why += f" at or above MovieLens.min_rating = {self._min_rating}"
    return (
      f"the MovieLens test split is empty ({why}), so there is nothing to "
      "evaluate on. Set MovieLens.test_fraction > 0 (e.g. 0.2), use "
      "split = 'files' with a test file, or set train.eval_data to "
      "another source."
    )

  def candidates(self, batch_size: int) -> tf.data.Dataset:
    """Each item once (ids 1..num_items), `{"categorical": ...}` batches."""
    return candidate_batches(
      range(1, self.num_items + 1), self._item_features, batch_size
    )
