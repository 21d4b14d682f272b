"""MovieLens values checked where they are read (issue 28): ratings against
the dataset's scale, history weights scaled by it, overlapping or repeated
rows of a split, ids trained on no rating, an empty test split."""

import logging

import numpy as np
import pytest

import recsys  # noqa: F401
from recsys.data import DataFormatError, MovieLens, MovieLensConfigError
from recsys.data.user_history import UserHistory
from recsys.errors import SettingsError
from tests.data.test_movielens import write_atomic, write_ml100k

BASE = [
  (1, 1, 5, 881250949),
  (2, 1, 3, 881250950),
  (10, 2, 4, 881250951),
  (1, 3, 1, 881250952),
]
TEST = [(2, 2, 2, 881250953), (10, 3, 4, 881250954)]


def write_fold(folder, base=BASE, test=TEST):
  """ml-100k files with GroupLens' fold u1 (u1.base / u1.test)."""
  write_ml100k(folder, base + test)
  for name, rows in (("u1.base", base), ("u1.test", test)):
    (folder / name).write_text(
      "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows)
    )
  return str(folder)


@pytest.mark.parametrize("rating", ["0", "17", "100", "-3", "5.5"])
def test_a_rating_off_the_scale_names_the_file_and_line(tmp_path, rating):
  base = list(BASE)
  base[2] = (10, 2, rating, 881250951)
  folder = write_fold(tmp_path / "ml-100k", base=base)
  with pytest.raises(
    DataFormatError,
    match=rf"u1\.base:3: rating {float(rating):g} is outside the ml-100k "
    r"rating scale \[1, 5\] \(1 rating\(s\) are",
  ):
    MovieLens(folder, split="files")
  with pytest.raises(DataFormatError, match=r"u\.data:3: rating"):
    MovieLens(folder)  # the random split reads u.data: the same check


def test_atomic_files_have_the_half_star_scale(tmp_path):
  folder = write_atomic(tmp_path / "atomic")
  header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
  inter = tmp_path / "atomic" / "mini.inter"
  inter.write_text(header + "1\t1\t0.5\t1\n2\t1\t4.5\t2\n2\t2\t3\t3\n")
  assert MovieLens(folder).train_size + MovieLens(folder).test_size == 3
  inter.write_text(header + "1\t1\t0.5\t1\n2\t1\t0\t2\n")
  with pytest.raises(DataFormatError, match=r"mini\.inter:3: rating 0 .*"):
    MovieLens(folder)


def test_another_scale_is_declared_or_the_check_switched_off(tmp_path):
  base = list(BASE)
  base[0] = (1, 1, 9, 881250949)
  folder = write_fold(tmp_path / "ml-100k", base=base)
  with pytest.raises(DataFormatError, match="u1.base:1: rating 9"):
    MovieLens(folder, split="files")
  assert MovieLens(folder, split="files", rating_scale=(1, 10)).train_size == 4
  assert MovieLens(folder, split="files", rating_scale=None).train_size == 4
  with pytest.raises(MovieLensConfigError, match="lowest <= highest"):
    MovieLens(folder, split="files", rating_scale=(5, 1))


def test_history_weights_divide_by_the_top_of_the_scale(tmp_path):
  """Ratings of at most 4 (no 5 in the training split): a weight is the
  rating / 5, the scale's top, not / 4, the highest rating seen (by
  default; a declared scale's top; the highest rating without a scale)."""
  base = [(1, 1, 4, 1), (1, 2, 2, 2), (2, 1, 3, 3), (2, 2, 1, 4)]
  folder = write_fold(tmp_path / "ml-100k", base=base, test=[(10, 3, 4, 5)])
  for scale, top in (
    ({}, 5.0),
    ({"rating_scale": (0, 8)}, 8.0),
    ({"rating_scale": None}, 4.0),
  ):
    source = MovieLens(
      folder, split="files", history=UserHistory(weights="rating"), **scale
    )
    parsed = source.raw_parser().parse_raw(
      {"user_id": np.array(["1", "2"])}, ["user_history"]
    )
    # Newest first: user 1 rated item 2 (2 stars) after item 1 (4 stars).
    assert parsed["categorical"]["user_history"].to_list() == [[2, 1], [2, 1]]
    np.testing.assert_allclose(
      parsed["weights"]["user_history"].to_list(),
      [[2 / top, 4 / top], [1 / top, 3 / top]],
      rtol=1e-6,
    )


def test_rows_in_both_split_files_and_repeated_rows_are_counted(
  tmp_path, caplog
):
  """A test file equal to the training file, and repeated test rows: each
  counted in a warning naming the files; refused when strict."""
  folder = write_fold(
    tmp_path / "ml-100k", base=BASE, test=BASE[:3] + TEST + TEST[:1]
  )
  with caplog.at_level(logging.WARNING, "recsys.data.movielens"):
    source = MovieLens(folder, split="files")
  assert source.test_size == 6  # used as given
  warning = caplog.text
  assert "u1.base" in warning and "u1.test" in warning
  assert (
    "3 test ratings whose (user, item) pair is also a training rating"
    in warning
  )
  assert "1 test ratings that repeat a test (user, item) pair" in warning
  assert "user '1', item '1' at " in warning and "u1.test:1" in warning
  with pytest.raises(DataFormatError, match="3 test ratings whose"):
    MovieLens(folder, split="files", split_check="strict")
  with pytest.raises(SettingsError, match="split_check must be one of"):
    MovieLens(folder, split="files", split_check="never")


def test_a_clean_split_gives_no_warning(tmp_path, caplog):
  folder = write_fold(tmp_path / "ml-100k")
  with caplog.at_level(logging.WARNING, "recsys.data.movielens"):
    MovieLens(folder, split="files")
    MovieLens(folder, test_fraction=0.4)
  assert "split" not in caplog.text


def test_ids_rated_only_in_the_test_split_are_unknown(tmp_path):
  """User 10 and item 3 are rated in u1.test only: real ids whose rows
  training never updates, flagged like ids not in the files."""
  base = [(1, 1, 5, 1), (2, 1, 3, 2), (2, 2, 4, 3)]
  folder = write_fold(tmp_path / "ml-100k", base=base, test=[(10, 3, 4, 4)])
  source = MovieLens(folder, split="files")
  unknown = source.raw_parser().unknown(
    {
      "user_id": np.array(["1", "10", "99", "2"]),
      "item_id": np.array(["1", "3", "2", "42"]),
    }
  )
  assert unknown["user_id"].numpy().tolist() == [False, True, True, False]
  assert unknown["item_id"].numpy().tolist() == [False, True, False, True]
  # An item in a training user's history shares the item table: trained.
  with_history = MovieLens(folder, split="files", history=UserHistory())
  assert with_history.raw_parser().unknown({"item_id": np.array(["3"])})[
    "item_id"
  ].numpy().tolist() == [True]


def test_an_empty_test_split_names_the_movielens_setting(tmp_path):
  source = MovieLens(write_ml100k(tmp_path / "ml-100k"), test_fraction=0.0)
  with pytest.raises(
    MovieLensConfigError, match=r"MovieLens.test_fraction = 0.0 keeps every"
  ):
    source.check_eval_split()
  MovieLens(
    write_ml100k(tmp_path / "ml-100k"), test_fraction=0.4
  ).check_eval_split()


def test_input_files_are_the_files_read(tmp_path):
  folder = tmp_path / "ml-100k"
  write_fold(folder)
  names = lambda s: sorted(p.rsplit("/", 1)[1] for p in s.input_files())  # noqa: E731
  assert names(MovieLens(str(folder))) == ["u.data", "u.item", "u.user"]
  assert names(MovieLens(str(folder), split="files")) == [
    "u.item",
    "u.user",
    "u1.base",
    "u1.test",
  ]
