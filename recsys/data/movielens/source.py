"""MovieLens as a data source: ratings (ranking), user-item pairs (retrieval).

The constructor runs four steps, each once: read a local folder
(`recsys.data.movielens.files`: GroupLens ml-100k, ml-1m, or RecBole atomic
files; `split_files` for a split given as files), encode raw ids
to contiguous ids (`encoding`; 0 is reserved for
unknown/out-of-vocabulary everywhere), split deterministically
(`split`: random with a seed, or temporal: the latest
`test_fraction` of ratings by timestamp), and build the features (the
`MovieLensRawParser` serving shares, the specs); batches are served from
memory.

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

As a stream, for dynamic-vocabulary tables (`stream`): `time_order`
delivers the examples oldest first (with split="temporal"), `raw_ids` the
user_id and item_id as raw int64 ids (`raw_ids`: the files' integer ids,
fingerprints of RecBole tokens) instead of contiguous ids.
"""

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Annotated

import gin
import numpy as np
import tensorflow as tf

from recsys import ranges
from recsys.data.movielens import files as movielens_files
from recsys.data.movielens import raw_ids as movielens_raw_ids
from recsys.data.movielens import split_files as movielens_split_files
from recsys.data.movielens import stream
from recsys.data.movielens.encoding import MovieLensVocabularies, encode
from recsys.data.movielens.raw import MovieLensRawParser
from recsys.data.movielens.split import (
  RatingSplit,
  check_split,
  split_ratings,
  timestamp_edges,
)
from recsys.data.pipeline import (
  AUTOTUNE,
  Batch,
  BatchRequest,
  DataSource,
  candidate_batches,
)
from recsys.data.user_history import HistoryTable, ItemHistory, UserHistory
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec
from recsys.process import console

log = logging.getLogger("recsys.data.movielens")

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


class MovieLensConfigError(SettingsError):
  """Inconsistent MovieLens settings."""


def _resolved_variant(
  data_dir: str, variant: str, dataset_name: str | None, download: bool
) -> str:
  """`variant`, or for "auto" the layout of the files in `data_dir`.

  Raises:
    DatasetNotFoundError: "auto" on a folder without MovieLens files (and
      no download asked for).
  """
  if variant != "auto":
    return variant
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
  return detected or "ml-100k"


def _read(
  data_dir: str,
  variant: str,
  split: str,
  dataset_name: str | None,
  fold: str,
  download: bool,
) -> tuple[movielens_files.RawMovieLens, np.ndarray | None]:
  """The read step: the ratings and metadata, and with split="files" the
  files' `is_test` (None otherwise)."""
  if split == "files":
    return movielens_split_files.read(data_dir, variant, dataset_name, fold)
  raw = movielens_files.read(
    data_dir, variant, dataset_name, allow_download=download
  )
  return raw, None


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


def _encoded_ids(
  raw: movielens_files.RawMovieLens, vocab: MovieLensVocabularies
) -> tuple[np.ndarray, np.ndarray]:
  """The ratings' user and item ids, by the parser that the export's raw
  signature runs too: training and serving map raw ids the same way."""
  encoder = MovieLensRawParser(
    vocab.users, vocab.items, vocab.user_side, *vocab.genre_bags
  )
  return (
    encoder.user_index(raw.user).numpy(),
    encoder.item_index(raw.item).numpy(),
  )


@dataclasses.dataclass(frozen=True)
class _FeatureChoice:
  """The features delivered, in `ALL_FEATURES` order, and the histories
  behind user_history / item_history (None: that feature is not chosen)."""

  chosen: list[str]
  history: UserHistory | None
  item_history: ItemHistory | None

  @property
  def query_features(self) -> list[str]:
    return [
      f for f in self.chosen if f in QUERY_FEATURES or f == HISTORY_FEATURE
    ]

  @property
  def candidate_features(self) -> list[str]:
    return [
      f
      for f in self.chosen
      if f in CANDIDATE_FEATURES + (ITEM_HISTORY_FEATURE,)
    ]

  def histories(self) -> dict[str, UserHistory | ItemHistory | None]:
    """History feature name -> its history (None: not chosen)."""
    return {
      HISTORY_FEATURE: self.history,
      ITEM_HISTORY_FEATURE: self.item_history,
    }


def _choose_features(
  raw: movielens_files.RawMovieLens,
  variant: str,
  task: str,
  features: Sequence[str] | None,
  history: UserHistory | None,
  item_history: ItemHistory | None,
  timestamp_buckets: int,
) -> _FeatureChoice:
  """The features to deliver: those asked for (user_id and item_id always),
  or every available one but the opt-in ones not asked for.

  Raises:
    MovieLensConfigError: a feature the files do not have, or item_history
      with task="retrieval".
  """
  available = ["user_id", "item_id", "item_genres"]
  if raw.users:
    available += ["user_age", "user_gender", "user_occupation", "user_zip"]
  if timestamp_buckets > 0:
    available.append("timestamp")
  if raw.item_info:  # even with no year or word in 2 titles (ids 0)
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
  if HISTORY_FEATURE in chosen and history is None:
    history = UserHistory()
  if ITEM_HISTORY_FEATURE in chosen and item_history is None:
    item_history = ItemHistory()
  return _FeatureChoice(
    chosen,
    history if HISTORY_FEATURE in chosen else None,
    item_history if ITEM_HISTORY_FEATURE in chosen else None,
  )


def _history_tables(
  choice: _FeatureChoice,
  raw: movielens_files.RawMovieLens,
  ids: dict[str, np.ndarray],
  num_ids: dict[str, int],
  ratings: RatingSplit,
  rating_scale: tuple[float, float] | None,
) -> dict[str, HistoryTable | None]:
  """History feature name -> its bags, from the training ratings only
  (never a test one); None: the feature is not chosen.

  `ids` holds the ratings' user_id and item_id, `num_ids` their counts.
  """
  train = ratings.is_train
  columns = {name: values[train] for name, values in ids.items()}
  tables: dict[str, HistoryTable | None] = {}
  for name, history in choice.histories().items():
    tables[name] = (
      None
      if history is None
      else history.build(
        columns[history.key],
        columns[history.value],
        raw.rating[train],
        raw.timestamp[train],
        num_ids[history.key],
        rating_max=rating_scale[1] if rating_scale else None,
      )
    )
  return tables


def _trained_ids(
  choice: _FeatureChoice,
  tables: dict[str, HistoryTable | None],
  ids: dict[str, np.ndarray],
  num_ids: dict[str, int],
  ratings: RatingSplit,
) -> dict[str, np.ndarray]:
  """user_id / item_id -> bool `[n + 1]`, the ids whose embedding rows
  training updates: those of training examples, and those in a history bag
  that shares their table."""
  examples = ratings.is_train & ratings.keep
  trained = {
    name: np.bincount(ids[name][examples], minlength=num_ids[name] + 1)
    for name in ("user_id", "item_id")
  }
  for name, history in choice.histories().items():
    table = tables[name]
    if history is not None and table is not None and history.table is not None:
      trained[history.table] = trained[history.table] + np.bincount(
        table.ids, minlength=len(trained[history.table])
      )
  return {name: trained[name][: num_ids[name] + 1] > 0 for name in trained}


def _serving_parser(
  vocab: MovieLensVocabularies,
  edges: np.ndarray | None,
  tables: dict[str, HistoryTable | None],
  trained: dict[str, np.ndarray],
  raw_ids: str | None,
) -> MovieLensRawParser:
  """The raw ids -> features transformation of every feature, the one
  both the batches and the export's raw signature run (`raw_ids`: the
  kind of raw id user_id / item_id are delivered as; None: contiguous)."""
  return MovieLensRawParser(
    vocab.users,
    vocab.items,
    vocab.user_side,
    *vocab.genre_bags,
    edges,
    item_side={"item_year": vocab.item_year},
    item_bags={"item_title": vocab.title_bags},
    history=tables[HISTORY_FEATURE],
    item_history=tables[ITEM_HISTORY_FEATURE],
    trained_users=trained["user_id"],
    trained_items=trained["item_id"],
    raw_ids=raw_ids,
  )


def _feature_specs(
  choice: _FeatureChoice,
  vocab: MovieLensVocabularies,
  tables: dict[str, HistoryTable | None],
  timestamp_buckets: int,
  raw_ids: bool,
) -> list[FeatureSpec]:
  """The chosen features' specs: vocabulary, bag width, weights, table,
  raw ids (user_id and item_id with `raw_ids`: their vocabulary size is
  then the capacity that holds every id of the files)."""
  vocab_sizes = vocab.vocab_sizes(timestamp_buckets)
  max_ids = {
    "item_genres": int(vocab.genre_bags[1].max()),
    "item_title": int(vocab.title_bags[1].max()),
    **{
      name: max(t.max_length, 1) if t is not None else 1
      for name, t in tables.items()
    },
  }
  built = {n: h for n, h in choice.histories().items() if h is not None}
  return [
    FeatureSpec(
      name,
      vocab_sizes[name],
      multi_hot=name in max_ids,
      max_ids=max_ids.get(name, 1),
      weighted=name in built and built[name].weighted,
      table=built[name].table if name in built else None,
      raw_ids=raw_ids and name in ("user_id", "item_id"),
    )
    for name in choice.chosen
  ]


#: A split's examples: user ids, item ids, ratings, timestamp buckets.
SplitArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _split_arrays(
  raw: movielens_files.RawMovieLens,
  ids: dict[str, np.ndarray],
  ratings: RatingSplit,
  parser: MovieLensRawParser,
  edges: np.ndarray | None,
  time_order: bool,
) -> dict[str, SplitArrays]:
  """ "train" / "test" -> the examples' arrays the batches gather from,
  in the files' order or (`time_order`) oldest first."""
  stamp = (
    parser.timestamp_bucket(raw.timestamp).numpy()
    if edges is not None
    else np.zeros(len(raw.user), np.int64)
  )
  out = {}
  for name in ("train", "test"):
    rows = ratings.rows(name)
    if time_order:
      rows = stream.time_ordered(rows, raw.timestamp)
    out[name] = (
      ids["user_id"][rows],
      ids["item_id"][rows],
      raw.rating[rows],
      stamp[rows],
    )
  return out


def _item_probability(train_items: np.ndarray, num_items: int) -> np.ndarray:
  """Each item id's share of the training examples (retrieval's
  candidate_sampling_probability)."""
  counts = np.bincount(train_items, minlength=num_items + 1)
  return (counts / max(counts.sum(), 1)).astype(np.float32)


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
    shuffle: whether training examples are shuffled (resolved).
    time_order, raw_ids: the settings (see `__init__`).
  """

  candidate_id_feature: str = "item_id"

  @ranges.checked
  def __init__(
    self,
    data_dir: ranges.Name,
    variant: Annotated[str, ranges.Choice(("auto", *VARIANTS))] = "auto",
    task: Annotated[str, ranges.Choice(TASKS)] = "ranking",
    split: Annotated[str, ranges.Choice(SPLITS)] = "random",
    test_fraction: Annotated[float, ranges.Real(0, 1, hi_open=True)] = 0.2,
    seed: ranges.Seed = 0,
    features: ranges.Names | None = None,
    min_rating: ranges.AnyNumber = 0.0,
    zip_prefix_length: ranges.NonNegativeInt = 2,
    timestamp_buckets: Annotated[int, ranges.Int(0, note="0: none")] = 0,
    dataset_name: ranges.Name | None = None,
    download: ranges.Flag = False,
    shuffle: ranges.Flag | None = None,
    fold: Annotated[str, ranges.Choice(movielens_split_files.FOLDS)] = "u1",
    history: UserHistory | None = None,
    title_min_count: ranges.PositiveInt = 2,
    item_history: ItemHistory | None = None,
    rating_scale: Annotated[
      Sequence[float] | str | None,
      ranges.AnyOf(
        (
          ranges.Choice(("auto",)),
          ranges.Each(ranges.Real(), min_len=2, max_len=2),
        )
      ),
    ] = "auto",
    split_check: Annotated[str, ranges.Choice(SPLIT_CHECKS)] = "warn",
    time_order: ranges.Flag = False,
    raw_ids: ranges.Flag = False,
  ):
    """Reads, encodes, splits, and builds the features: each step once.

    Args:
      data_dir: folder with the files (or with a `<variant>/` subfolder).
      variant: "ml-100k", "ml-1m", "atomic" (RecBole files), or "auto":
        detected from the files (`*.inter` -> atomic, `u.data` -> ml-100k,
        `ratings.dat` -> ml-1m; ml-100k to download when there are none).
      task: "ranking" (labels = ratings) or "retrieval" (labels = ones).
      split: "random" (seeded), "temporal" (test = latest ratings) or
        "files": a fixed split given as files, used as given
        (`recsys.data.movielens.split_files`: ml-100k's `<fold>.base` /
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
      shuffle: shuffle training examples (seeded, reshuffled each epoch);
        None: shuffle unless `time_order`.
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
      time_order: deliver both splits' examples oldest first (ties: the
        earlier in the files), unshuffled; needs split="temporal", so the
        evaluation is the latest `test_fraction` (`stream`).
      raw_ids: deliver user_id and item_id as raw int64 ids
        (`FeatureSpec.raw_ids`): GroupLens' ids as the integers they are,
        RecBole tokens as 64-bit fingerprints (`raw_ids`). Ranking only;
        a history sharing their table is refused (`stream`).

    Raises:
      SettingRangeError: a setting outside its declared range.
      MovieLensConfigError: an unknown feature, an empty test split;
        time_order or raw_ids with a setting they contradict.
      DatasetNotFoundError: the folder or files are missing.
      DataFormatError: a file does not parse, or a rating is off the scale
        (names file and line); the splits overlap (split_check="strict");
        with raw_ids, a GroupLens id that is not an int64.
    """
    self.time_order, self.raw_ids = bool(time_order), bool(raw_ids)
    self.shuffle = stream.resolved_shuffle(
      shuffle, self.time_order, split, MovieLensConfigError
    )
    variant = _resolved_variant(data_dir, variant, dataset_name, download)
    self.variant, self.task, self.split = variant, task, split
    self._test_fraction, self._min_rating = test_fraction, min_rating
    self.seed = int(seed)
    self.num_dense = 0

    # Read: the files, their ratings on the declared scale.
    raw, file_is_test = _read(
      data_dir, variant, split, dataset_name, fold, download
    )
    self.source_folder, self._files = raw.source, list(raw.files)
    self.rating_scale = _rating_scale(rating_scale, variant)
    if self.rating_scale is not None:
      movielens_files.check_rating_scale(raw, self.rating_scale, variant)

    # Encode: vocabularies over every id in the files, the ratings' ids.
    vocab = encode(raw, zip_prefix_length, title_min_count)
    self.num_users, self.num_items = vocab.num_users, vocab.num_items
    self.genres, self.title_vocab = vocab.genres, vocab.title_vocab
    user, item = _encoded_ids(raw, vocab)
    ids = {"user_id": user, "item_id": item}
    num_ids = {"user_id": self.num_users, "item_id": self.num_items}

    # Choose the features (and the histories behind history features).
    choice = _choose_features(
      raw, variant, task, features, history, item_history, timestamp_buckets
    )
    self._chosen = choice.chosen
    self.history, self.item_history = choice.history, choice.item_history
    self.query_features = choice.query_features
    self.candidate_features = choice.candidate_features
    raw_kind = None
    if self.raw_ids:
      stream.check_raw_ids(
        task, choice.history, choice.item_history, MovieLensConfigError
      )
      raw_kind = movielens_raw_ids.kind_of(variant)
      if raw_kind == "integer":
        movielens_raw_ids.check_integer_ids(
          raw, {"user_id": vocab.users, "item_id": vocab.items}
        )

    # Split: the test ratings and the examples; histories from training.
    ratings = split_ratings(
      raw,
      split,
      test_fraction,
      self.seed,
      file_is_test,
      min_rating if task == "retrieval" else None,
    )
    edges = timestamp_edges(raw.timestamp, ratings, timestamp_buckets)
    tables = _history_tables(
      choice, raw, ids, num_ids, ratings, self.rating_scale
    )
    check_split(raw, user, item, ratings.is_test, split, split_check)

    # Features: the parser (batches and serving), the specs, the examples.
    self._raw = _serving_parser(
      vocab,
      edges,
      tables,
      _trained_ids(choice, tables, ids, num_ids, ratings),
      raw_kind,
    )
    self.feature_specs = _feature_specs(
      choice, vocab, tables, timestamp_buckets, self.raw_ids
    )
    self._splits = _split_arrays(
      raw, ids, ratings, self._raw, edges, self.time_order
    )
    self.train_size = len(self._splits["train"][0])
    self.test_size = len(self._splits["test"][0])
    self._item_probability = _item_probability(
      self._splits["train"][1], self.num_items
    )
    log.info(
      "MovieLens %s from %s: %d users, %d items, %d ratings; "
      "%s split %d train / %d test",
      variant,
      raw.source,
      self.num_users,
      self.num_items,
      len(raw.user),
      split,
      self.train_size,
      self.test_size,
      extra=console.shown_as(console.DATA),
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
    batches are drawn from a seeded permutation, reshuffled every epoch
    (unless `shuffle` is off: the split's order, oldest first with
    `time_order`); batching happens on indices, so the per-example cost is
    a gather.

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
