"""The user-history feature (no label or test leakage), new side features."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import MovieLens
from recsys.data.movielens import MovieLensConfigError
from recsys.data.movielens import files as movielens_files
from recsys.data.user_history import ItemHistory, UserHistory
from recsys.errors import SettingsError
from recsys.testing.movielens import write_ml100k_like
from tests.data.test_movielens import in_order, write_atomic, write_ml100k


def rows(source, training, feature="user_history", with_label=False):
  """(user, item, history ids, history weights or None[, label]) of every
  example."""
  out = []
  for features, labels in source.dataset(
    64, training=training, repeat=False, drop_remainder=False
  ):
    cat = features["categorical"]
    weights = (features.get("weights") or {}).get(feature)
    hist = cat[feature].to_list()
    w = weights.to_list() if weights is not None else [None] * len(hist)
    for u, i, h, hw, y in zip(
      cat["user_id"].numpy(), cat["item_id"].numpy(), hist, w, labels.numpy()
    ):
      out.append((int(u), int(i), h, hw) + ((float(y),) if with_label else ()))
  return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
  return write_ml100k_like(
    str(tmp_path_factory.mktemp("ml") / "ml-100k"),
    num_users=40,
    num_items=60,
    num_ratings=900,
    seed=3,
  )


@pytest.mark.parametrize("task", ["ranking", "retrieval"])
def test_history_has_no_target_item_and_no_test_rating(generated, task):
  source = MovieLens(
    generated, task=task, seed=5, history=UserHistory(), shuffle=False
  )
  train, test = rows(source, True), rows(source, False)
  assert len(train) == source.train_size and len(test) == source.test_size
  train_items, test_items = (
    collections.defaultdict(set),
    collections.defaultdict(set),
  )
  for u, i, _, _ in train:
    train_items[u].add(i)
  for u, i, _, _ in test:
    test_items[u].add(i)
  for u, i, history, _ in train + test:
    assert i not in history  # never the example's own item
    assert not set(history) & test_items[u]  # never a test rating
    expected = sorted(train_items[u] - {i}) or [0]
    assert sorted(history) == expected  # exactly the other training items
  spec = {s.name: s for s in source.feature_specs}["user_history"]
  assert spec.table == "item_id" and spec.multi_hot
  assert spec.vocabulary_size == source.num_items + 1
  assert spec.max_ids == max(len(v) for v in train_items.values())
  assert "user_history" in source.query_features


def test_history_from_raw_ids_matches_the_reader(generated):
  source = MovieLens(generated, seed=1, history=UserHistory(weights="rating"))
  parser = source.raw_parser()
  spec = parser.raw_feature_spec(["user_id", "user_history"])
  assert set(spec) == {"user_id"}  # served from the raw user id alone
  (u, i, history, weights), *_ = rows(source, True)
  raw_user = tf.constant([str(u)])
  full = parser.parse_raw({"user_id": raw_user}, ["user_history"])
  assert sorted(full["categorical"]["user_history"][0].numpy()) == sorted(
    history + [i]
  )
  scored = parser.parse_raw(
    {"user_id": raw_user, "item_id": tf.constant([str(i)])}, ["user_history"]
  )
  assert scored["categorical"]["user_history"][0].numpy().tolist() == history
  assert scored["weights"]["user_history"][0].numpy().tolist() == weights


def test_history_weights_and_max_length(tmp_path):
  # User 1 rated item 1 (5 stars, oldest) and item 3 (1 star, newest).
  folder = write_ml100k(tmp_path / "ml-100k")
  by_rating = in_order(
    folder,
    history=UserHistory(weights="rating"),
  )
  examples = rows(by_rating, True)
  # Example 0: user 1, item 1 -> history [item 3] weighted 1/5.
  assert examples[0][:3] == (1, 1, [3])
  np.testing.assert_allclose(examples[0][3], [0.2])
  recency = in_order(
    folder,
    history=UserHistory(weights="recency", half_life=1.0),
  )
  full = recency.raw_parser().parse_raw(
    {"user_id": tf.constant(["1"])}, ["user_history"]
  )
  assert full["categorical"]["user_history"][0].numpy().tolist() == [3, 1]
  np.testing.assert_allclose(full["weights"]["user_history"][0], [1.0, 0.5])
  short = in_order(
    folder,
    history=UserHistory(max_length=1),
  )
  # Newest only (user 1: item 3, user 2: item 2); own item dropped -> [0].
  assert [h for _, _, h, _ in rows(short, True)][:4] == [[3], [2], [0], [0]]
  with pytest.raises(SettingsError, match="UserHistory.weights must be one"):
    UserHistory(weights="ratings")


@pytest.mark.parametrize("layout", ["ml-100k", "atomic"])
def test_side_features_read_from_known_rows(tmp_path, layout):
  writer = write_ml100k if layout == "ml-100k" else write_atomic
  source = in_order(
    writer(tmp_path / layout),
    title_min_count=1,
    features=["user_id", "item_id", "item_year", "item_title", "user_zip"],
  )
  # Titles: "Toy Story", "Cafe Society", "Nothing"; years 1995, 1995, 1996.
  assert source.title_vocab == ["caf", "nothing", "society", "story", "toy"]
  corpus = next(iter(source.candidates(3)))["categorical"]
  assert corpus["item_id"].numpy().tolist() == [1, 2, 3]
  assert corpus["item_year"].numpy().tolist() == [1, 1, 2]
  assert corpus["item_title"].to_list() == [[4, 5], [1, 3], [2]]
  specs = {s.name: s for s in source.feature_specs}
  assert specs["item_year"].vocabulary_size == 3
  assert specs["item_title"].multi_hot and specs["item_title"].max_ids == 2
  assert source.candidate_features == ["item_id", "item_year", "item_title"]
  # Opt-in: the default selection is unchanged.
  default = MovieLens(writer(tmp_path / "again"), test_fraction=0.0)
  names = [s.name for s in default.feature_specs]
  assert "item_title" not in names and "user_history" not in names


def test_title_and_year_parsing():
  parse = movielens_files.title_and_year
  assert parse("Toy Story (1995)") == {"title": "Toy Story", "year": "1995"}
  assert parse("Nadja (1994)", "") == {"title": "Nadja", "year": "1994"}
  assert parse("unknown", "") == {"title": "unknown", "year": ""}
  assert parse("Heat", "15-Dec-1995") == {"title": "Heat", "year": "1995"}


def test_item_history_has_no_own_user_and_no_test_rating(generated):
  source = MovieLens(
    generated,
    seed=5,
    item_history=ItemHistory(weights="rating"),
    shuffle=False,
  )
  train = rows(source, True, "item_history", with_label=True)
  test = rows(source, False, "item_history", with_label=True)
  raters = collections.defaultdict(dict)  # item -> {user: training rating}
  test_users = collections.defaultdict(set)
  for u, i, _, _, y in train:
    raters[i][u] = y
  for u, i, _, _, _ in test:
    test_users[i].add(u)
  for u, i, history, weights, _ in train + test:
    assert u not in history  # never the example's own user
    assert not set(history) & test_users[i]  # never a test rating
    others = {v: y for v, y in raters[i].items() if v != u}
    assert sorted(history) == (sorted(others) or [0])
    expected = [others[v] / 5.0 for v in history] if others else [1.0]
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
  specs = {s.name: s for s in source.feature_specs}
  spec = specs["item_history"]
  assert spec.table == "user_id" and spec.multi_hot and spec.weighted
  assert spec.vocabulary_size == source.num_users + 1
  assert spec.max_ids == max(len(v) for v in raters.values())
  assert "item_history" in source.candidate_features
  assert "user_history" not in specs  # independent of the user history
  # Served from the raw item id: all its training raters, minus the user.
  parser = source.raw_parser()
  assert set(parser.raw_feature_spec(["item_history"])) == {"item_id"}
  u, i, history, _, _ = train[0]
  full = parser.parse_raw({"item_id": tf.constant([str(i)])}, ["item_history"])
  assert sorted(full["categorical"]["item_history"][0].numpy()) == sorted(
    history + [u]
  )
  with pytest.raises(MovieLensConfigError, match="ranking"):
    MovieLens(generated, task="retrieval", item_history=ItemHistory())
  own = MovieLens(generated, item_history=ItemHistory(share_user_table=False))
  assert {s.name: s for s in own.feature_specs}["item_history"].table is None
