"""Data files saved with a byte-order mark read as the same data (issue 43).

A MovieLens `u.data` saved "as UTF-8 with BOM" had a phantom user
'\\ufeff196' (user 196 lost a rating), and a BOM before `u.user` / `u.item`
cost user 1 and movie 1 their side features, with only a vague warning; a
Criteo file's first label was not 0 or 1. Each reader is given the same
files twice, plain and with a BOM (latin-1 files converted to UTF-8, as an
editor saving them so does), and must give identical datasets; a UTF-16
file is refused, naming it.
"""

import gzip
import logging
import shutil

import numpy as np
import pytest

from recsys.data import CriteoTSV, DataFormatError, MovieLens
from tests.data import test_movielens
from tests.data import test_movielens_identity as movielens_identity
from tests.data.test_criteo import V, collect, make_rows, write
from tests.data.test_movielens import (
  RATINGS,
  everything,
  write_atomic,
  write_ml100k,
)

BOM = b"\xef\xbb\xbf"
ALL_FEATURES = movielens_identity.ALL  # every feature a reader makes


def with_bom(path, encoding="utf-8"):
  """Rewrites a text file as UTF-8 with a byte-order mark."""
  text = path.read_bytes().decode(encoding)
  path.write_bytes(BOM + text.encode("utf-8"))


def _ratings_text(rows, sep="\t"):
  return "".join(sep.join(str(v) for v in row) + "\n" for row in rows)


def write_ml1m(folder):
  return test_movielens.write_ml1m(
    folder,
    "1193::One Flew (1975)::Drama\n661::Caf\xe9 (1996)::Animation|Musical\n"
    "914::My Fair Lady (1964)::Musical|Romance\n",
    "1::1193::5::978300760\n1::661::3::978302109\n2::914::3::978301968\n"
    "2::1193::4::978301969\n",
  )


def write_folds(folder):
  write_ml100k(folder)
  (folder / "u1.base").write_text(_ratings_text(RATINGS[:3]))
  (folder / "u1.test").write_text(_ratings_text(RATINGS[3:]))
  return str(folder)


# (writer, MovieLens arguments, {file: its encoding})
LAYOUTS = {
  "ml-100k": (
    write_ml100k,
    {},
    {"u.data": "ascii", "u.user": "ascii", "u.item": "latin-1"},
  ),
  "ml-100k folds": (
    write_folds,
    {"split": "files"},
    {"u1.base": "ascii", "u1.test": "ascii", "u.user": "ascii"},
  ),
  "ml-1m": (
    write_ml1m,
    {},
    {"ratings.dat": "ascii", "users.dat": "ascii", "movies.dat": "latin-1"},
  ),
  "atomic": (
    write_atomic,
    {},
    {"mini.inter": "utf-8", "mini.user": "utf-8", "mini.item": "utf-8"},
  ),
}


def _read(folder, args):
  source = MovieLens(
    str(folder),
    features=ALL_FEATURES,
    title_min_count=1,
    test_fraction=0.4,
    shuffle=False,
    **args,
  )
  parsed = source.raw_parser().parse_raw(
    {"user_id": np.array(["1", "2", "10"]), "item_id": np.array(["1"] * 3)},
    ["user_id", "item_id"],
  )
  return {
    "sizes": (source.num_users, source.num_items),
    "train_test": (source.train_size, source.test_size),
    "genres": source.genres,
    "titles": source.title_vocab,
    "train": everything(source, training=True),
    "test": everything(source, training=False),
    "specs": [(s.name, s.vocabulary_size) for s in source.feature_specs],
    "served": {k: v.numpy().tolist() for k, v in parsed["categorical"].items()},
  }


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_movielens_files_with_a_byte_order_mark_read_the_same(
  tmp_path, caplog, layout
):
  write_files, args, encodings = LAYOUTS[layout]
  plain = tmp_path / "plain"
  write_files(plain)
  want = _read(plain, args)
  for name, encoding in encodings.items():  # one file at a time, then all
    marked = tmp_path / name
    shutil.copytree(plain, marked)
    with_bom(marked / name, encoding)
    with caplog.at_level(logging.WARNING, "recsys.data"):
      assert _read(marked, args) == want, name
    assert not caplog.records, [r.getMessage() for r in caplog.records]
  every = tmp_path / "every"
  shutil.copytree(plain, every)
  for name, encoding in encodings.items():
    with_bom(every / name, encoding)
  assert _read(every, args) == want


def test_a_mark_on_a_latin1_file_that_is_not_utf8_is_refused(tmp_path):
  """A BOM says UTF-8; latin-1 bytes after it are not: refused by line."""
  folder = tmp_path / "ml-100k"
  write_ml100k(folder)
  (folder / "u.item").write_bytes(BOM + (folder / "u.item").read_bytes())
  with pytest.raises(DataFormatError) as e:
    MovieLens(str(folder))
  message = str(e.value)
  assert f"{folder / 'u.item'}:2: not valid utf-8 text (it starts with a " in (
    message
  )


@pytest.mark.parametrize("name", ["u.data", "u.user", "u.item"])
def test_a_utf16_movielens_file_is_refused_naming_it(tmp_path, name):
  folder = tmp_path / "ml-100k"
  write_ml100k(folder)
  text = (folder / name).read_bytes().decode("latin-1")
  (folder / name).write_bytes(text.encode("utf-16"))
  with pytest.raises(DataFormatError) as e:
    MovieLens(str(folder))
  assert f"{folder / name}: the file starts with a UTF-16 byte-order mark" in (
    str(e.value)
  )


def _criteo(folder, **args):
  source = CriteoTSV(
    data_dir=str(folder),
    vocab_dir=str(folder / "vocab"),
    vocab_sizes=V,
    chunk_size=4,
    shuffle_files=False,
    **args,
  )
  got = {
    split: collect(
      source.dataset(3, training=split, repeat=False, drop_remainder=False)
    )
    for split in (True, False)
  }
  return source, got


def _write_criteo(folder, compress):
  folder.mkdir()
  rows = make_rows(9)
  suffix = ".gz" if compress else ""
  write(folder / f"train.txt{suffix}", rows, compress=compress)
  write(folder / f"val.txt{suffix}", make_rows(5, start=50), compress=compress)
  (folder / "vocab").mkdir()
  known = [r[2][0] for r in rows[:4] if r[2][0]]
  (folder / "vocab" / "C1.txt").write_text("\n".join(known) + "\n")
  return rows


def _add_bom(path):
  if path.name.endswith(".gz"):
    with gzip.open(path, "rb") as f:
      data = f.read()
    with gzip.open(path, "wb") as f:
      f.write(BOM + data)
  else:
    path.write_bytes(BOM + path.read_bytes())


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("malformed", ["fail", "skip"])
def test_criteo_files_with_a_byte_order_mark_read_the_same(
  tmp_path, compress, malformed
):
  plain, marked = tmp_path / "plain", tmp_path / "marked"
  _write_criteo(plain, compress)
  _, want = _criteo(plain, malformed=malformed)
  c1 = want[True][2]["C1"]
  assert (c1[:4] > 0).sum() >= 3  # the vocabulary file's values are found
  shutil.copytree(plain, marked)
  suffix = ".gz" if compress else ""
  for name in (f"train.txt{suffix}", f"val.txt{suffix}", "vocab/C1.txt"):
    _add_bom(marked / name)
  source, got = _criteo(marked, malformed=malformed)
  for split in (True, False):
    np.testing.assert_array_equal(got[split][0], want[split][0])
    # Exact: the same lines, so log1p runs on the same chunk shapes.
    np.testing.assert_array_equal(got[split][1], want[split][1])
    for name, ids in want[split][2].items():
      np.testing.assert_array_equal(got[split][2][name], ids, err_msg=name)
  assert source.malformed_lines() == 0


@pytest.mark.parametrize("name", ["train.txt", "val.txt.gz", "vocab/C1.txt"])
def test_a_utf16_criteo_file_is_refused_naming_it(tmp_path, name):
  folder = tmp_path / "criteo"
  folder.mkdir()
  write(folder / "train.txt", make_rows(3))
  write(folder / "val.txt.gz", make_rows(3, start=9), compress=True)
  (folder / "vocab").mkdir()
  (folder / "vocab" / "C1.txt").write_text("aaaa0001\n")
  path = folder / name
  if name.endswith(".gz"):
    with gzip.open(path, "rb") as f:
      text = f.read().decode("ascii")
    with gzip.open(path, "wb") as f:
      f.write(text.encode("utf-16"))
  else:
    path.write_bytes(path.read_text().encode("utf-16"))
  with pytest.raises(DataFormatError) as e:
    CriteoTSV(
      data_dir=str(folder), vocab_dir=str(folder / "vocab"), vocab_sizes=V
    )
  assert f"{path}: the file starts with a UTF-16 byte-order mark" in str(
    e.value
  )
