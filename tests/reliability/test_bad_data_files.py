"""Damaged data files: truncated or fake gzip, empty files, folders, bad vocabs.

tests/data/ covers malformed Criteo lines (fail and skip), missing folders and
files, and short MovieLens rows; this adds what a bad download or a wrong
path produces: every such case must raise an error naming the file (and line)
instead of a raw TF error, a silent short read or an endless wait.
"""

import gzip
import os
import threading
import zlib

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys import cli
from recsys.data import (
  CriteoTSV,
  DataFormatError,
  DatasetNotFoundError,  # noqa: E402
  MovieLens,
)
from tests.data.test_criteo import (
  assert_same,
  collect,
  make_rows,
  reference,
  to_line,
)  # noqa: E402
from tests.data.test_movielens import write_atomic, write_ml100k  # noqa: E402

V = 23
ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
ROWS = make_rows(60)
TEXT = "".join(to_line(r) + "\n" for r in ROWS)


def read_all(path, **kwargs):
  source = CriteoTSV(train_files=str(path), vocab_sizes=V, **kwargs)
  return collect(source.dataset(4, repeat=False, drop_remainder=False))


def first_batch_within(dataset, seconds=60.0):
  """The first batch, or the exception it raised; fails if it takes forever."""
  out = {}

  def run():
    try:
      out["batch"] = next(iter(dataset))
    except Exception as e:  # noqa: BLE001 - handed to the test
      out["error"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), (
    f"no batch and no error after {seconds} s (a hang)"
  )
  return out


# -- Criteo: gzip --------------------------------------------------------------


def test_truncated_gzip_mid_line_fails_naming_the_file_and_hinting_truncation(
  tmp_path,
):
  path = tmp_path / "day_0.gz"
  data = gzip.compress(TEXT.encode())
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    read_all(path)
  assert f"{path}:" in str(info.value) and "gzip -t" in str(info.value)


def test_truncated_gzip_is_not_skipped_silently(tmp_path):
  path = tmp_path / "day_0.gz"
  data = gzip.compress(TEXT.encode())
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"Criteo file {path} is a truncated or corrupt gzip file",
  ):
    read_all(path, malformed="skip")


def test_gzip_cut_at_a_line_boundary_is_an_error_not_a_short_read(tmp_path):
  """TF's reader ends quietly here: 30 good lines, no error, unchecked."""
  path = tmp_path / "day_0.gz"
  stream = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
  half = "".join(to_line(r) + "\n" for r in ROWS[:30]).encode()
  path.write_bytes(stream.compress(half) + stream.flush(zlib.Z_SYNC_FLUSH))
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"{path} is a truncated or corrupt gzip file.*30 lines read",
  ):
    read_all(path)
  source = CriteoTSV(train_files=str(path), vocab_sizes=V)
  outcome = first_batch_within(source.dataset(4).skip(20))  # training: repeats
  assert "truncated" in str(outcome.get("error"))


@pytest.mark.parametrize(
  "variant", ["multi_member", "crlf", "no_final_newline"]
)
def test_complete_gzip_variants_read_whole_without_false_alarm(
  tmp_path, variant
):
  text = TEXT
  if variant == "crlf":
    data = gzip.compress(text.replace("\n", "\r\n").encode())
  elif variant == "no_final_newline":
    data = gzip.compress(text.rstrip("\n").encode())
  else:
    half = len(text) // 2
    data = gzip.compress(text[:half].encode()) + gzip.compress(
      text[half:].encode()
    )
  path = tmp_path / "day_0.gz"
  path.write_bytes(data)
  assert_same(read_all(path), reference(ROWS))


def _assert_refused(match, **arguments):
  """`CriteoTSV(vocab_sizes=V, **arguments)` raises a DataFormatError
  matching `match`."""
  with pytest.raises(DataFormatError, match=match):
    CriteoTSV(vocab_sizes=V, **arguments)


def test_plain_text_named_gz_is_refused_at_construction(tmp_path):
  path = tmp_path / "day_0.gz"
  path.write_text(TEXT)
  _assert_refused(
    rf"'{path}' ends in .gz but is not "
    r"gzip-compressed.*remove the .gz suffix",
    train_files=str(path),
  )


# -- Criteo: empty files, folders ----------------------------------------------


@pytest.mark.parametrize(
  "name,data",
  [("day_0", b""), ("day_0.gz", b""), ("day_0.gz", gzip.compress(b""))],
  ids=["plain", "zero_byte_gz", "empty_gz"],
)
def test_empty_files_are_refused_at_construction(tmp_path, name, data):
  path = tmp_path / name
  path.write_bytes(data)
  _assert_refused(
    rf"every Criteo training file is empty: \['{path}'\]",
    train_files=str(path),
  )


def test_one_empty_file_among_others_is_a_warning(tmp_path, caplog):
  (tmp_path / "day_0").write_text("")
  (tmp_path / "day_1").write_text(TEXT)
  with caplog.at_level("WARNING", logger="recsys.data.criteo"):
    got = collect(
      CriteoTSV(
        train_files=str(tmp_path / "day_*"), vocab_sizes=V, shuffle_files=False
      ).dataset(4, repeat=False, drop_remainder=False)
    )
  assert_same(got, reference(ROWS))
  assert f"{tmp_path / 'day_0'} is empty" in caplog.text


@pytest.mark.parametrize(
  "text", ["\n\n\n", "x\ny\n"], ids=["blank", "all_malformed"]
)
def test_no_well_formed_line_with_skip_and_repeat_fails_instead_of_hanging(
  tmp_path, text
):
  path = tmp_path / "train.txt"
  path.write_text(text)
  source = CriteoTSV(train_files=str(path), vocab_sizes=V, malformed="skip")
  outcome = first_batch_within(source.dataset(4))
  assert isinstance(outcome.get("error"), tf.errors.InvalidArgumentError)
  assert str(path) in str(outcome["error"])
  assert "hold no well-formed line" in str(outcome["error"])


def test_a_folder_given_as_a_file(tmp_path):
  (tmp_path / "criteo").mkdir()
  with pytest.raises(
    DatasetNotFoundError,
    match=rf"names the folder '{tmp_path / 'criteo'}'.*pass "
    rf"data_dir='{tmp_path / 'criteo'}'",
  ):
    CriteoTSV(train_files=str(tmp_path / "criteo"), vocab_sizes=V)


def test_glob_patterns_skip_folders(tmp_path):
  (tmp_path / "day_vocab").mkdir()
  (tmp_path / "day_0").write_text(TEXT)
  source = CriteoTSV(train_files=str(tmp_path / "day_*"), vocab_sizes=V)
  assert source.train_files == [str(tmp_path / "day_0")]


# -- Criteo: vocabulary files --------------------------------------------------


def _assert_c3_vocabulary_refused(tmp_path, text, match):
  """With TEXT as train.txt and `text` as vocab/C3.txt, CriteoTSV raises a
  DataFormatError matching `match`."""
  (tmp_path / "train.txt").write_text(TEXT)
  (tmp_path / "vocab").mkdir()
  (tmp_path / "vocab" / "C3.txt").write_text(text)
  _assert_refused(
    match,
    train_files=str(tmp_path / "train.txt"),
    vocab_dir=str(tmp_path / "vocab"),
  )


def test_empty_vocabulary_file(tmp_path):
  _assert_c3_vocabulary_refused(
    tmp_path,
    "",
    r"vocabulary file '.*C3.txt' is empty; expected one C3 value per line",
  )


def test_repeated_vocabulary_value_names_both_lines(tmp_path):
  _assert_c3_vocabulary_refused(
    tmp_path,
    "a1\nb2\nc3\nb2\n",
    r"C3.txt:4: vocabulary value 'b2' repeats line 2",
  )


# -- MovieLens -----------------------------------------------------------------


@pytest.mark.parametrize(
  "file,match",
  [
    ("u.data", r"u\.data: no ratings \(the file is empty"),
    ("u.item", r"u\.item: no movies \(the file is empty or blank\)"),
    ("u.user", r"u\.user: no users \(the file is empty or blank\)"),
  ],
)
def test_movielens_empty_files(tmp_path, file, match):
  folder = tmp_path / "ml-100k"
  write_ml100k(folder)
  (folder / file).write_text("\n")
  with pytest.raises(DataFormatError, match=match):
    MovieLens(str(folder))


@pytest.mark.parametrize("rating", ["nan", "inf", "-inf"])
def test_movielens_non_finite_rating_names_file_and_line(tmp_path, rating):
  folder = tmp_path / "ml-100k"
  write_ml100k(folder, [(1, 1, 5, 881250949), (2, 1, rating, 881250950)])
  with pytest.raises(
    DataFormatError,
    match=rf"u\.data:2: rating and timestamp must be "
    rf"finite numbers, got '{rating}'",
  ):
    MovieLens(str(folder))


def test_atomic_header_only_and_non_finite_rating(tmp_path):
  folder = tmp_path / "atomic"
  write_atomic(folder)
  header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
  (folder / "mini.inter").write_text(header)
  with pytest.raises(DataFormatError, match=r"mini\.inter: no ratings"):
    MovieLens(str(folder), variant="atomic")
  (folder / "mini.inter").write_text(header + "1\t1\t4\t1\n\n2\t1\tnan\t2\n")
  with pytest.raises(
    DataFormatError,
    match=r"mini\.inter:4: rating and timestamp "
    r"fields must be finite numbers, got 'nan'",
  ):
    MovieLens(str(folder), variant="atomic")


def test_movielens_ml1m_short_line(tmp_path):
  folder = tmp_path / "ml-1m"
  folder.mkdir()
  (folder / "ratings.dat").write_text("1::1::5::978300760\n1::2\n")
  (folder / "movies.dat").write_text("1::Toy Story (1995)::Animation|Comedy\n")
  (folder / "users.dat").write_text("1::F::1::10::48067\n")
  with pytest.raises(
    DataFormatError,
    match=r"ratings\.dat:2: expected 4 '::'-separated "
    r"fields, got 2",
  ):
    MovieLens(str(folder), variant="ml-1m")


def test_movielens_ratings_without_metadata_are_counted(tmp_path, caplog):
  folder = tmp_path / "ml-100k"
  write_ml100k(
    folder, [(1, 1, 5, 1), (99, 1, 3, 2), (2, 77, 4, 3), (2, 78, 4, 4)]
  )
  with caplog.at_level("WARNING", logger="recsys.data.movielens"):
    source = MovieLens(str(folder), test_fraction=0.0, shuffle=False)
  assert "1 rated users have no metadata (e.g. ['99'])" in caplog.text
  assert "2 rated movies have no metadata (e.g. ['77', '78'])" in caplog.text
  features, _ = next(iter(source.dataset(4, repeat=False)))
  np.testing.assert_array_equal(
    features["categorical"]["user_age"].numpy()[1], 0
  )


def test_movielens_data_dir_that_is_a_file(tmp_path):
  path = tmp_path / "u.data"
  path.write_text("1\t1\t5\t1\n")
  with pytest.raises(
    DatasetNotFoundError,
    match=rf"'{path}' is a file; data_dir must "
    "be the folder that holds the files",
  ):
    MovieLens(str(path))


# -- end to end: `recsys train` on a malformed Criteo file ---------------------


def test_recsys_train_on_a_malformed_criteo_line_prints_the_line(
  tmp_path, capfd
):
  """`recsys train` (`cli.main`, in this process; the file descriptors are
  captured, so TF's own error output counts too)."""
  lines = [to_line(r) for r in ROWS]
  lines[30] = "1\t2\t3"
  (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
  (tmp_path / "val.txt").write_text(TEXT)
  bindings = [
    f"CRITEO_DIR = '{tmp_path}'",
    "CriteoTSV.max_vocab_size = 50",
    "train.global_batch_size = 8",
    "train.train_steps = 4",
    "train.steps_per_loop = 2",
    "EmbeddingSettings.dim = 4",
    "DLRM.bottom_mlp = (8, 4)",
    "DLRM.top_mlp = (8,)",
    "train.eval_steps = 1",
    "train.progress_bar = False",
  ]
  args = [
    "train",
    "--gin_file",
    os.path.join(ROOT, "experiments", "criteo_dlrm.gin"),
    "--model_dir",
    str(tmp_path / "model"),
  ]
  for binding in bindings:
    args += ["--gin_bindings", binding]
  capfd.readouterr()
  code = cli.main(args)
  err = capfd.readouterr().err
  assert code == 1
  assert f"{tmp_path / 'train.txt'}:31" in err
  assert "Traceback" not in err


# -- values that overflow, bytes that are not text (issue 15) ----------------


@pytest.mark.parametrize(
  "rating,stamp,match",
  [
    ("1e39", "881250950", "got '1e39'"),  # inf as a float32 label
    ("4", "1e30", "got '4' and '1e30'"),  # overflows int64
  ],
)
def test_movielens_values_that_overflow_name_file_and_line(
  tmp_path, rating, stamp, match
):
  folder = tmp_path / "ml-100k"
  write_ml100k(folder, [(1, 1, 5, 881250949), (2, 1, rating, stamp)])
  with pytest.raises(DataFormatError, match=rf"u\.data:2: .*{match}"):
    MovieLens(str(folder))
  atomic = tmp_path / "atomic"
  write_atomic(atomic)
  header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
  (atomic / "mini.inter").write_text(
    header + f"1\t1\t4\t1\n2\t1\t{rating}\t{stamp}\n"
  )
  with pytest.raises(DataFormatError, match=r"mini\.inter:3: "):
    MovieLens(str(atomic), variant="atomic")


def test_invalid_utf8_in_a_movielens_file_names_file_and_line(tmp_path):
  folder = tmp_path / "atomic"
  write_atomic(folder)
  header = b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
  (folder / "mini.inter").write_bytes(
    header + b"1\t1\t4\t1\n2\t\xff\xfe\t4\t2\n"
  )
  with pytest.raises(DataFormatError, match=r"mini\.inter:3: not valid utf-8"):
    MovieLens(str(folder), variant="atomic")


@pytest.mark.parametrize(
  "value,reason",
  [
    (b"-", "is not an integer"),
    (b"9" * 40, "is not an integer"),  # float32 inf
    (b"9223372036854775808", "is not an integer that fits 64 bits"),
    (b"-9223372036854775809", "is not an integer that fits 64 bits"),
    (b"12\xff", "is not an integer"),
  ],
)
def test_criteo_dense_values_that_do_not_parse_name_file_and_line(
  tmp_path, value, reason
):
  lines = [to_line(r).encode() for r in ROWS[:6]]
  parts = lines[3].split(b"\t")
  parts[2] = value
  lines[3] = b"\t".join(parts)
  path = tmp_path / "train.txt"
  path.write_bytes(b"\n".join(lines) + b"\n")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=rf"train\.txt:4: a dense .*{reason}"
  ):
    read_all(path)
  got = read_all(path, malformed="skip")  # or dropped and counted
  assert len(got[0]) == 5


def test_criteo_invalid_utf8_names_file_and_line(tmp_path):
  lines = [to_line(r).encode() for r in ROWS[:6]]
  parts = lines[4].split(b"\t")
  parts[30] = b"\xff\xfe" + parts[30]
  lines[4] = b"\t".join(parts)
  path = tmp_path / "train.txt"
  path.write_bytes(b"\n".join(lines) + b"\n")
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"train\.txt:5: the line is not valid UTF-8",
  ):
    read_all(path)
