"""MovieLens readers (ml-100k, ml-1m, RecBole atomic) on small files the tests write."""

import os

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import (
  DataFormatError,
  DatasetNotFoundError,
  MovieLens,
  MovieLensConfigError,
)
from recsys.data.movielens import files as movielens_files
from recsys.errors import SettingsError

GENRES = movielens_files.ML100K_GENRES
ML100K_USERS = (
  "1|24|M|technician|85711\n2|53|F|other|94043\n10|17|M|student|T8H1N\n"
)
RATINGS = [
  (1, 1, 5, 881250949),
  (2, 1, 3, 881250950),
  (10, 2, 4, 881250951),
  (1, 3, 1, 881250952),
  (2, 2, 2, 881250953),
]


def flags(*names):
  return "|".join("1" if g in names else "0" for g in GENRES)


def write_ml100k(folder, ratings=RATINGS):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "u.user").write_text(ML100K_USERS)
  toy = flags("Animation", "Children's", "Comedy")
  items = (
    f"1|Toy Story (1995)|01-Jan-1995||http://x|{toy}\n"
    f"2|Caf\xe9 Society (1995)|01-Jan-1995||http://y|{flags('Action')}\n"
    f"3|Nothing (1996)|01-Jan-1996||http://z|{flags()}\n"
  )
  (folder / "u.item").write_bytes(items.encode("latin-1"))
  (folder / "u.data").write_text(
    "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ratings)
  )
  return str(folder)


def write_ml1m(folder, movies, ratings):
  """ml-1m's files in `folder` (created): two users, `movies` (written
  latin-1, as GroupLens's) and `ratings` (text of "::" lines)."""
  folder.mkdir(parents=True)
  (folder / "users.dat").write_text("1::F::1::10::48067\n2::M::56::16::70072\n")
  (folder / "movies.dat").write_bytes(movies.encode("latin-1"))
  (folder / "ratings.dat").write_text(ratings)
  return str(folder)


def write_atomic(folder, name="mini"):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{name}.inter").write_text(
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    + "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS)
  )
  (folder / f"{name}.user").write_text(
    "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
    + ML100K_USERS.replace("|", "\t")
  )
  (folder / f"{name}.item").write_text(
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "1\tToy Story\t1995\tAnimation Children's Comedy\n"
    "2\tCaf\u00e9 Society\t1995\tAction\n"
    "3\tNothing\t1996\t\n"
  )
  return str(folder)


def in_order(folder, **options):
  """Every rating of `folder` in training, in file order."""
  return MovieLens(folder, test_fraction=0.0, shuffle=False, **options)


def everything(source, training=True, batch=2):
  """All examples of a split, features as Python lists, in order."""
  out, labels = {}, []
  for features, l in source.dataset(
    batch, training=training, repeat=False, drop_remainder=False
  ):
    for name, value in features["categorical"].items():
      out.setdefault(name, []).extend(
        value.to_list()
        if isinstance(value, tf.RaggedTensor)
        else value.numpy().tolist()
      )
    if "candidate_sampling_probability" in features:
      out.setdefault("q", []).extend(
        features["candidate_sampling_probability"].numpy().tolist()
      )
    labels.extend(l.numpy().tolist())
  return out, labels


# Encodings by the documented rules: users sorted numerically 1, 2, 10 -> 1, 2, 3;
# ages 24, 53, 17 -> buckets 18-24 = 2, 50-55 = 6, <18 = 1; occupations
# other, student, technician -> 1, 2, 3; zip prefixes 85, 94, T8 -> 1, 2, 3; genres
# present sorted: Action, Animation, Children's, Comedy -> 1..4 (item 3 has none -> [0]).
EXPECTED_100K = {
  "user_id": [1, 2, 3, 1, 2],
  "user_age": [2, 6, 1, 2, 6],
  "user_gender": [1, 2, 1, 1, 2],
  "user_occupation": [3, 1, 2, 3, 1],
  "user_zip": [1, 2, 3, 1, 2],
  "item_id": [1, 1, 2, 3, 2],
  "item_genres": [[2, 3, 4], [2, 3, 4], [1], [0], [1]],
}


def test_ml100k_exact_values(tmp_path):
  source = in_order(write_ml100k(tmp_path / "ml-100k"), variant="ml-100k")
  assert (
    source.num_users,
    source.num_items,
    source.train_size,
    source.test_size,
  ) == (3, 3, 5, 0)
  assert source.num_dense == 0
  assert source.genres == ["Action", "Animation", "Children's", "Comedy"]
  features, labels = everything(source)
  assert features == EXPECTED_100K
  assert labels == [5.0, 3.0, 4.0, 1.0, 2.0]
  specs = {s.name: s for s in source.feature_specs}
  assert (
    specs["user_id"].vocabulary_size == 4
    and specs["item_id"].vocabulary_size == 4
  )
  assert specs["item_genres"].multi_hot and specs["item_genres"].max_ids == 3
  assert (
    specs["item_genres"].vocabulary_size == 5
    and specs["user_age"].vocabulary_size == 8
  )
  batch, _ = next(iter(source.dataset(5, repeat=False)))
  genres = batch["categorical"]["item_genres"]
  assert (
    isinstance(genres, tf.RaggedTensor) and genres.row_splits.dtype == tf.int64
  )
  assert batch["categorical"]["user_id"].dtype == tf.int64


def test_atomic_files_read_like_grouplens(tmp_path):
  atomic = in_order(write_atomic(tmp_path / "mini"), variant="atomic")
  features, labels = everything(atomic)
  assert features == EXPECTED_100K and labels == [5.0, 3.0, 4.0, 1.0, 2.0]
  # Also found in a <dataset_name>/ subfolder.
  sub = in_order(str(tmp_path), variant="atomic", dataset_name="mini")
  assert everything(sub)[0] == EXPECTED_100K


def test_ml1m_exact_values(tmp_path):
  write_ml1m(
    tmp_path / "ml-1m",
    "1193::One Flew (1975)::Drama\n661::James (1996)::Animation|Children's|Musical\n"
    "914::My Fair Lady (1964)::Musical|Romance\n",
    "1::1193::5::978300760\n1::661::3::978302109\n2::914::3::978301968\n",
  )
  source = in_order(str(tmp_path), variant="ml-1m")
  features, labels = everything(source)
  # items sorted numerically 661, 914, 1193 -> 1, 2, 3; genres Animation, Children's, Drama,
  # Musical, Romance -> 1..5; occupations "10", "16" -> 1, 2; ages 1 -> <18, 56 -> 56+.
  assert features == {
    "user_id": [1, 1, 2],
    "user_age": [1, 1, 7],
    "user_gender": [2, 2, 1],
    "user_occupation": [1, 1, 2],
    "user_zip": [1, 1, 2],
    "item_id": [3, 1, 2],
    "item_genres": [[3], [1, 2, 4], [4, 5]],
  }
  assert labels == [5.0, 3.0, 3.0]


def ratings(n=60):
  rng = np.random.default_rng(0)
  return [
    (
      int(rng.choice([1, 2, 10])),
      int(rng.integers(1, 4)),
      int(rng.integers(1, 6)),
      1000 + int(rng.integers(0, 10_000)),
    )
    for _ in range(n)
  ]


def test_splits_are_deterministic_disjoint_and_temporal(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", ratings())
  split = lambda **kw: MovieLens(
    folder, test_fraction=0.25, features=["user_id"], **kw
  )
  a, b, c = split(seed=1), split(seed=1), split(seed=2)
  assert (a.train_size, a.test_size) == (45, 15)
  test_a = everything(a, training=False)
  assert test_a == everything(b, training=False) and test_a != everything(
    c, training=False
  )
  # Temporal: every test rating is at least as new as every training rating.
  temporal = MovieLens(
    folder, split="temporal", test_fraction=0.25, timestamp_buckets=4
  )
  train, _ = everything(temporal)
  test, _ = everything(temporal, training=False)
  assert min(test["timestamp"]) >= max(train["timestamp"])
  assert sorted(set(train["timestamp"])) == [1, 2, 3, 4]


def test_retrieval_task(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", ratings())
  source = in_order(folder, task="retrieval", min_rating=4)
  assert source.query_features == [
    "user_id",
    "user_age",
    "user_gender",
    "user_occupation",
    "user_zip",
  ]
  assert source.candidate_features == ["item_id", "item_genres"]
  assert source.candidate_id_feature == "item_id"
  features, labels = everything(source)
  kept = [r for r in ratings() if r[2] >= 4]
  assert len(labels) == len(kept) and set(labels) == {1.0}
  counts = np.bincount(features["item_id"], minlength=4)
  np.testing.assert_allclose(
    features["q"], counts[features["item_id"]] / len(kept), rtol=1e-6
  )
  corpus = [b["categorical"] for b in source.candidates(2)]
  assert sum((c["item_id"].numpy().tolist() for c in corpus), []) == [1, 2, 3]
  assert sum((c["item_genres"].to_list() for c in corpus), []) == [
    [2, 3, 4],
    [1],
    [0],
  ]


def test_two_input_pipelines_cover_every_rating_once(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", ratings(23))
  source = MovieLens(folder, test_fraction=0.0)
  key = lambda f, l: list(zip(f["user_id"], f["item_id"], l))
  whole = key(*everything(source, batch=5))
  shards = []
  for pipeline in range(2):
    ctx = tf.distribute.InputContext(2, pipeline, 2)
    for features, l in source.dataset(
      5, input_context=ctx, repeat=False, drop_remainder=False
    ):
      shards += list(
        zip(
          features["categorical"]["user_id"].numpy().tolist(),
          features["categorical"]["item_id"].numpy().tolist(),
          l.numpy().tolist(),
        )
      )
  assert len(whole) == 23 and sorted(shards) == sorted(whole)


def test_missing_folder_names_folder_and_files(tmp_path):
  with pytest.raises(DatasetNotFoundError) as info:
    MovieLens(str(tmp_path / "nowhere"), variant="ml-100k")
  message = str(info.value)
  assert (
    str(tmp_path / "nowhere") in message
    and "u.data" in message
    and "ml-100k.zip" in message
  )
  with pytest.raises(DatasetNotFoundError, match="ratings.dat"):
    MovieLens(str(tmp_path), variant="ml-1m")
  with pytest.raises(DatasetNotFoundError, match="recbole"):
    MovieLens(str(tmp_path), variant="atomic")


def test_offline_download_gives_the_same_clear_message(tmp_path, monkeypatch):
  monkeypatch.setitem(
    movielens_files.URLS, "ml-100k", "http://127.0.0.1:9/ml-100k.zip"
  )
  with pytest.raises(DatasetNotFoundError) as info:
    MovieLens(str(tmp_path / "dl"), variant="ml-100k", download=True)
  assert "download from http://127.0.0.1:9/ml-100k.zip failed" in str(
    info.value
  )
  assert str(tmp_path / "dl") in str(info.value) and "u.data" in str(info.value)


def test_malformed_file_names_file_and_line(tmp_path):
  folder = tmp_path / "ml-100k"
  write_ml100k(folder)
  (folder / "u.data").write_text("1\t1\t5\t881250949\n2\t1\n")
  with pytest.raises(DataFormatError, match=r"u\.data:2: expected 4"):
    MovieLens(str(folder))
  atomic = tmp_path / "atomic"
  write_atomic(atomic)
  (atomic / "mini.inter").write_text("user_id\titem_id\n1\t2\n")
  with pytest.raises(
    DataFormatError, match=r"mini\.inter:1: header field 'user_id' has no"
  ):
    MovieLens(str(atomic), variant="atomic")


def test_feature_selection_and_config_errors(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k")
  source = MovieLens(folder, features=["item_genres"])
  assert [s.name for s in source.feature_specs] == [
    "user_id",
    "item_id",
    "item_genres",
  ]
  features, _ = next(iter(source.dataset(2)))
  assert set(features["categorical"]) == {"user_id", "item_id", "item_genres"}
  with pytest.raises(MovieLensConfigError, match="available"):
    MovieLens(folder, features=["director"])
  with pytest.raises(SettingsError, match="MovieLens.split must be one of"):
    MovieLens(folder, split="by_user")


def test_training_shuffle_is_seeded_and_covers_each_epoch(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", ratings(23))
  key = lambda f, l: list(
    zip(
      f["categorical"]["user_id"].numpy().tolist(),
      f["categorical"]["item_id"].numpy().tolist(),
      l.numpy().tolist(),
    )
  )

  def epochs(seed):
    source = MovieLens(folder, test_fraction=0.0, seed=seed)
    batches = [
      key(f, l)
      for f, l in source.dataset(5, drop_remainder=False, repeat=True).take(10)
    ]
    return sum(batches[:5], []), sum(batches[5:], [])

  first, second = epochs(seed=4)
  assert len(first) == len(second) == 23 and sorted(first) == sorted(second)
  assert first != second  # reshuffled each epoch
  assert epochs(seed=4) == (first, second)  # seeded
  assert epochs(seed=5)[0] != first


def test_variant_auto_detects_the_layout_from_the_files(tmp_path):
  atomic = in_order(write_atomic(tmp_path / "mini"))
  assert atomic.variant == "atomic" and everything(atomic)[0] == EXPECTED_100K
  grouplens = in_order(write_ml100k(tmp_path / "ml-100k"))
  assert (
    grouplens.variant == "ml-100k" and everything(grouplens)[0] == EXPECTED_100K
  )
  (tmp_path / "empty").mkdir()
  with pytest.raises(
    DatasetNotFoundError, match=r"\.inter.*u\.data.*ratings\.dat"
  ):
    MovieLens(str(tmp_path / "empty"))


def _ratings_text(rows, sep="\t"):
  return "".join(sep.join(str(v) for v in row) + "\n" for row in rows)


def _split_files(folder, variant, sizes):
  """`folder`'s source split by its files, its layout `variant` and its
  (train, test) sizes `sizes`."""
  source = MovieLens(str(folder), split="files", shuffle=False)
  assert source.variant == variant
  assert (source.train_size, source.test_size) == sizes
  return source


def test_fixed_split_from_grouplens_fold_files(tmp_path):
  """ml-100k's u1.base / u1.test are the train / test split, as given."""
  folder = tmp_path / "ml-100k"
  write_ml100k(folder)
  (folder / "u1.base").write_text(_ratings_text(RATINGS[:3]))
  (folder / "u1.test").write_text(_ratings_text(RATINGS[3:]))
  source = _split_files(folder, "ml-100k", (3, 2))
  train, train_labels = everything(source, training=True)
  test, test_labels = everything(source, training=False)
  # Same encodings as the whole-file reader: users 1, 2, 10 -> 1, 2, 3.
  assert train["user_id"] == EXPECTED_100K["user_id"][:3] and train_labels == [
    5.0,
    3.0,
    4.0,
  ]
  assert test["user_id"] == EXPECTED_100K["user_id"][3:] and test_labels == [
    1.0,
    2.0,
  ]
  assert test["item_genres"] == EXPECTED_100K["item_genres"][3:]
  with pytest.raises(DatasetNotFoundError, match="u2.base and u2.test"):
    MovieLens(str(folder), split="files", fold="u2")


def test_fixed_split_from_recbole_benchmark_files(tmp_path):
  folder = tmp_path / "mini"
  write_atomic(folder)
  os.remove(folder / "mini.inter")
  header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
  (folder / "mini.train.inter").write_text(header + _ratings_text(RATINGS[1:]))
  (folder / "mini.test.inter").write_text(header + _ratings_text(RATINGS[:1]))
  source = _split_files(folder, "atomic", (4, 1))
  test, labels = everything(source, training=False)
  assert labels == [5.0] and test["user_id"] == [1] and test["user_age"] == [2]
  assert everything(source)[1] == [3.0, 4.0, 1.0, 2.0]
