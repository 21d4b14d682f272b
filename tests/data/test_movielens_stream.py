"""MovieLens as a stream: examples in time order, raw user and item ids."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import DataFormatError, MovieLens, MovieLensConfigError
from recsys.data.movielens import raw_ids
from recsys.data.user_history import ItemHistory, UserHistory
from tests.data.test_movielens import everything, write_ml100k

#: (user, item, rating, timestamp) in file order: times out of order, ties
#: (500 three times, 300 twice) broken by the line.
RATINGS = [
  (10, 3, 4, 500),
  (1, 1, 5, 100),
  (2, 2, 3, 500),
  (1, 2, 2, 300),
  (2, 1, 4, 50),
  (10, 1, 1, 300),
  (1, 3, 5, 900),
  (2, 3, 2, 500),
]


def by_time(rows):
  """`rows` oldest first, ties in file order (what time_order promises)."""
  return [r for _, r in sorted(enumerate(rows), key=lambda x: (x[1][3], x[0]))]


def stream(source, training=True):
  """(user_id, item_id, rating) of every example of a split, in order."""
  features, labels = everything(source, training=training, batch=3)
  return list(zip(features["user_id"], features["item_id"], labels))


def test_time_order_streams_each_split_oldest_first(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  source = MovieLens(
    folder, split="temporal", test_fraction=0.25, time_order=True, raw_ids=True
  )
  assert not source.shuffle
  ordered = [(u, i, float(r)) for u, i, r, _ in by_time(RATINGS)]
  # The latest quarter by time is the test split: of the three ratings at
  # 500 the latest line, and the one at 900.
  assert stream(source) == ordered[:6]
  assert stream(source, training=False) == ordered[6:]
  # A repeated split replays the stream from its start every epoch.
  replay = [
    u
    for f, _ in source.dataset(3, repeat=True).take(4)
    for u in f["categorical"]["user_id"].numpy().tolist()
  ]
  assert replay == [u for u, _, _ in ordered[:6]] * 2
  # Input pipeline p of 2 takes examples p, p + 2, ... of the stream.
  for pipeline in range(2):
    ctx = tf.distribute.InputContext(2, pipeline, 2)
    got = [
      (u, i)
      for f, _ in source.dataset(
        2, input_context=ctx, repeat=False, drop_remainder=False
      )
      for u, i in zip(
        f["categorical"]["user_id"].numpy().tolist(),
        f["categorical"]["item_id"].numpy().tolist(),
      )
    ]
    assert got == [(u, i) for u, i, _ in ordered[:6][pipeline::2]]


def test_time_order_keeps_contiguous_ids_without_raw_ids(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  source = MovieLens(
    folder, split="temporal", test_fraction=0.25, time_order=True
  )
  contiguous = {1: 1, 2: 2, 10: 3}  # users sorted numerically; items 1..3
  ordered = by_time(RATINGS)[:6]
  assert stream(source) == [
    (contiguous[u], i, float(r)) for u, i, r, _ in ordered
  ]
  assert not any(spec.raw_ids for spec in source.feature_specs)


def test_raw_ids_are_the_grouplens_ids_and_nothing_else_changes(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  plain = MovieLens(folder, test_fraction=0.0, shuffle=False)
  raw = MovieLens(folder, test_fraction=0.0, shuffle=False, raw_ids=True)
  specs = {s.name: s for s in raw.feature_specs}
  assert [n for n, s in specs.items() if s.raw_ids] == ["user_id", "item_id"]
  # The vocabulary size is the capacity that holds every id of the files.
  assert (
    specs["user_id"].vocabulary_size,
    specs["item_id"].vocabulary_size,
  ) == (
    4,
    4,
  )
  got, labels = everything(raw)
  want, want_labels = everything(plain)
  assert got["user_id"] == [u for u, _, _, _ in RATINGS]
  assert got["item_id"] == [i for _, i, _, _ in RATINGS]
  for name in want:
    if name not in ("user_id", "item_id"):
      assert got[name] == want[name], name
  assert labels == want_labels
  features, _ = next(iter(raw.dataset(4)))
  assert features["categorical"]["user_id"].dtype == tf.int64


def write_tokens(folder):
  """RecBole atomic files whose user ids are words (items: "1", "2")."""
  folder.mkdir(parents=True)
  (folder / "mini.inter").write_text(
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "carol\t1\t4\t20\nalice\t2\t5\t10\nbob\t1\t3\t30\n"
  )
  (folder / "mini.user").write_text(
    "user_id:token\tage:token\tgender:token\toccupation:token\t"
    "zip_code:token\nalice\t24\tF\tother\t85711\n"
    "bob\t53\tM\tother\t94043\ncarol\t17\tF\tstudent\t12345\n"
  )
  return str(folder)


def test_recbole_tokens_get_stable_64_bit_fingerprints(tmp_path):
  folder = write_tokens(tmp_path / "atomic")
  source = MovieLens(
    folder, variant="atomic", test_fraction=0.0, shuffle=False, raw_ids=True
  )
  got, _ = everything(source)
  users = ["carol", "alice", "bob"]
  # The int64 whose little-endian bytes are tf.fingerprint's farmhash64.
  digest = tf.fingerprint(tf.constant(users)).numpy()
  assert got["user_id"] == np.frombuffer(digest.tobytes(), "<i8").tolist()
  # Item tokens are fingerprinted too, though they look like numbers.
  assert (
    got["item_id"] == raw_ids.fingerprint64(["1", "2", "1"]).numpy().tolist()
  )
  # Pinned, so that a change of function (or of TF's) cannot pass unseen.
  assert raw_ids.fingerprint64(["alice", "196"]).numpy().tolist() == [
    -8321384245627934459,
    -3038677446987699407,
  ]
  assert raw_ids.raw_ids([" alice "], "fingerprint").numpy()[0] == (
    -8321384245627934459
  )
  # The side features still come from each token's metadata.
  assert got["user_gender"] == [2, 2, 1]


def test_serving_delivers_the_raw_id_of_any_id_sent(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  source = MovieLens(folder, test_fraction=0.0, raw_ids=True)
  parser = source.raw_parser()
  names = ["user_id", "user_gender", "item_id", "item_genres"]
  features = parser.parse_raw(
    {
      "user_id": tf.constant(["2", " 10", "99999"]),
      "item_id": tf.constant(["3", "1", "-7"]),
    },
    names,
  )["categorical"]
  assert features["user_id"].numpy().tolist() == [2, 10, 99999]
  assert features["item_id"].numpy().tolist() == [3, 1, -7]
  # Side features by the vocabulary: an id not in the files is unknown (0).
  assert features["user_gender"].numpy().tolist() == [2, 1, 0]
  assert parser.unknown({"user_id": tf.constant(["2", "99999"])})[
    "user_id"
  ].numpy().tolist() == [False, True]


def test_raw_ids_refuse_what_needs_contiguous_ids(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  with pytest.raises(MovieLensConfigError, match="task='ranking'") as info:
    MovieLens(folder, task="retrieval", raw_ids=True)
  assert "MovieLens.task = 'retrieval'" in str(info.value)
  with pytest.raises(
    MovieLensConfigError, match="UserHistory.share_item_table = True"
  ) as info:
    MovieLens(folder, features=["user_history"], raw_ids=True)
  assert "MovieLens.raw_ids = True" in str(info.value)
  with pytest.raises(
    MovieLensConfigError, match="ItemHistory.share_user_table = True"
  ):
    MovieLens(folder, item_history=ItemHistory(), raw_ids=True)
  # A history in a table of its own keeps its contiguous ids.
  source = MovieLens(
    folder, history=UserHistory(share_item_table=False), raw_ids=True
  )
  spec = source.spec("user_history")
  assert not spec.raw_ids and spec.table is None
  assert source.spec("item_id").raw_ids


def test_time_order_refuses_shuffle_and_other_splits(tmp_path):
  folder = write_ml100k(tmp_path / "ml-100k", RATINGS)
  with pytest.raises(MovieLensConfigError, match="MovieLens.shuffle = True"):
    MovieLens(folder, split="temporal", time_order=True, shuffle=True)
  for split in ("random", "files"):
    with pytest.raises(
      MovieLensConfigError, match=f"MovieLens.split = '{split}'"
    ):
      MovieLens(folder, split=split, time_order=True)


def test_grouplens_ids_must_be_int64_once_each(tmp_path):
  bad = RATINGS[:3] + [("x7", 1, 3, 700)]
  folder = write_ml100k(tmp_path / "a", bad)
  with pytest.raises(DataFormatError, match=r"u\.data:4.*'x7'") as info:
    MovieLens(folder, raw_ids=True)
  assert "MovieLens.raw_ids = True" in str(info.value)
  MovieLens(folder)  # contiguous ids take any string
  twice = RATINGS[:3] + [("010", 1, 3, 700)]  # user "10" written twice
  folder = write_ml100k(tmp_path / "b", twice)
  with pytest.raises(DataFormatError, match="the same int64 10"):
    MovieLens(folder, raw_ids=True)
