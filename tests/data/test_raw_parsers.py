"""The TF raw-value parsers against the readers' output and documented references.

Serving runs `source.raw_parser().parse_raw` on what a client sends; it must
give what the reader gives for the same values in a file, including missing
values, negative integers and out-of-vocabulary ids.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import CATEGORICAL_NAMES, CriteoTSV, SyntheticCTR
from recsys.data.criteo_raw import DENSE_NAMES, DENSE_PATTERN, CriteoRawParser
from tests.data.test_criteo import V, collect, make_rows, reference, write
from tests.data.test_movielens import (
  EXPECTED_100K,
  RATINGS,
  everything,
  in_order,
  write_ml100k,
)

# Negatives, missing, the largest count int64 holds, 0, hex in and out of
# the C1 vocabulary file, a row of empty categoricals, non-hex text.
TRICKY = [
  (
    "1",
    [
      "-2",
      "",
      "0",
      "7",
      "123456789012",
      "-1",
      "3",
      "",
      "5",
      "1",
      "0",
      "-0",
      "9",
    ],
    ["aaaa0001"] + [f"{j:08x}" for j in range(25)],
  ),
  ("0", [""] * 13, [""] * 26),
  (
    "1",
    [str(2**63 - 1)] + ["1"] * 12,
    ["notinvoc"] + ["68fd1e64"] * 12 + ["x y", "Ü"] * 6 + [""],
  ),
] + make_rows(6, start=40)


def _raw_columns(rows):
  raw = {
    n: tf.constant([r[1][k] for r in rows]) for k, n in enumerate(DENSE_NAMES)
  }
  raw.update(
    {
      n: tf.constant([r[2][k] for r in rows])
      for k, n in enumerate(CATEGORICAL_NAMES)
    }
  )
  return raw


def test_criteo_parse_raw_equals_the_reader_and_the_reference(tmp_path):
  write(tmp_path / "train.txt", TRICKY)
  (tmp_path / "vocab").mkdir()
  (tmp_path / "vocab" / "C1.txt").write_text("aaaa0001\nbbbb\n")
  source = CriteoTSV(
    str(tmp_path / "train.txt"),
    vocab_sizes=V,
    vocab_dir=str(tmp_path / "vocab"),
    shuffle_files=False,
  )
  read = collect(
    source.dataset(
      len(TRICKY), training=True, repeat=False, drop_remainder=False
    )
  )
  parser = source.raw_parser()
  parsed = parser.parse_raw(_raw_columns(TRICKY), CATEGORICAL_NAMES)

  # Not bit-exact: log1p's SIMD body and scalar tail round differently, and
  # the reader parses chunks of its own size.
  np.testing.assert_allclose(parsed["dense"].numpy(), read[1], rtol=1e-6)
  for name in CATEGORICAL_NAMES:
    np.testing.assert_array_equal(
      parsed["categorical"][name].numpy(), read[2][name], name
    )
  # Against the documented conventions, computed independently (C2..C26 hashed).
  _, dense, ids = reference(TRICKY)
  np.testing.assert_allclose(parsed["dense"].numpy(), dense, rtol=1e-6)
  assert parsed["dense"].numpy()[0, :3].tolist() == [0.0, 0.0, 0.0]  # -2, "", 0
  for name in CATEGORICAL_NAMES[1:]:
    np.testing.assert_array_equal(
      parsed["categorical"][name].numpy(), ids[name], name
    )
  # C1 has a vocabulary file: line n -> id n; empty and out-of-vocabulary -> 0.
  c1 = parsed["categorical"]["C1"].numpy()
  assert c1[:3].tolist() == [1, 0, 0]
  unknown = parser.unknown(_raw_columns(TRICKY))
  assert list(unknown) == ["C1"]
  assert unknown["C1"].numpy()[:3].tolist() == [False, False, True]


@pytest.mark.parametrize(
  "bad",
  [
    "1.5",
    "abc",
    "-",
    " 3",
    "1e3",
    "9" * 39,
    "9223372036854775808",  # 2**63: above int64
    "-9223372036854775809",
  ],
)
def test_criteo_parse_raw_refuses_a_dense_value_the_reader_refuses(bad):
  parser = CriteoRawParser([V] * 26)
  raw = _raw_columns(TRICKY[:2])
  raw["I4"] = tf.constant(["7", bad])
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    parser.parse_raw(raw, CATEGORICAL_NAMES)
  assert f"raw feature I4 got [{bad}] at row 1;" in str(error.value)
  with pytest.raises(tf.errors.InvalidArgumentError) as error:  # in a graph too
    tf.function(lambda r: parser.parse_raw(r, CATEGORICAL_NAMES))(raw)
  assert f"raw feature I4 got [{bad}] at row 1;" in str(error.value)


@pytest.mark.parametrize("value", ["ab\tcd", "\t", "x\n"])
def test_criteo_parse_raw_refuses_a_categorical_value_no_tsv_line_holds(value):
  parser = CriteoRawParser([V] * 26)
  raw = _raw_columns(TRICKY[:2])
  raw["C7"] = tf.constant(["68fd1e64", value])
  first = value.split("\t")[0].split("\n")[0]
  for parse in (parser.parse_raw, tf.function(parser.parse_raw)):
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
      parse(raw, CATEGORICAL_NAMES)
    message = str(error.value)
    assert f"raw feature C7 got [{first}\\" in message  # \t, \n shown
    assert "] at row 1; expected one TSV column" in message
    assert "\t" not in message.split("expected one TSV")[0]


def test_criteo_dense_pattern_accepts_exactly_the_int64_counts():
  """Fuzz: RE2's verdict on random counts (leading zeros, signs, lengths
  around 19 digits, the int64 bounds) is Python's `int` in int64 range."""
  rng = np.random.default_rng(28)
  bounds = [str(2**63 - 1), str(2**63), str(-(2**63)), str(-(2**63) - 1)]
  values = bounds + ["", "-", "0", "-0", "00", "1.5", "+3", "1e3", " 3"]
  for _ in range(400):
    digits = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 23))))
    if rng.random() < 0.3:  # near the bound: 922337203685477580x
      digits = str(2**63 - 8 + int(rng.integers(0, 16)))
    zeros = "0" * int(rng.integers(0, 3)) if rng.random() < 0.2 else ""
    values.append(("-" if rng.random() < 0.3 else "") + zeros + digits)

  def fits(text):
    if not re.fullmatch(r"-?[0-9]+", text):
      return text == ""
    return -(2**63) <= int(text) <= 2**63 - 1

  got = tf.strings.regex_full_match(tf.constant(values), DENSE_PATTERN)
  want = [fits(v) for v in values]
  assert got.numpy().tolist() == want
  assert 100 < sum(want) < len(values) - 50  # both verdicts drawn often


def test_movielens_parse_raw_equals_the_reader(tmp_path):
  ratings = [*RATINGS, (10, 3, 4, 881250999)]
  source = in_order(
    write_ml100k(tmp_path / "ml-100k", ratings),
    variant="ml-100k",
    timestamp_buckets=3,
  )
  read, _ = everything(source)
  parser = source.raw_parser()
  names = [s.name for s in source.feature_specs]
  raw = {
    "user_id": tf.constant([str(u) for u, _, _, _ in ratings]),
    "item_id": tf.constant([str(i) for _, i, _, _ in ratings]),
    "timestamp": tf.constant([t for _, _, _, t in ratings], tf.int64),
  }
  parsed = parser.parse_raw(raw, names)["categorical"]
  assert list(parsed) == names
  for name in names:
    got = parsed[name]
    got = (
      got.to_list()
      if isinstance(got, tf.RaggedTensor)
      else got.numpy().tolist()
    )
    assert got == read[name], name
  for name, want in EXPECTED_100K.items():  # the reader's documented encodings
    assert read[name][:5] == want, name
  # Timestamp quantile buckets of the training times: 1..3 in time order.
  assert (
    read["timestamp"] == sorted(read["timestamp"]) and read["timestamp"][0] == 1
  )


def test_movielens_out_of_vocabulary_ids_map_to_0_and_are_flagged(tmp_path):
  source = in_order(write_ml100k(tmp_path / "ml-100k"), variant="ml-100k")
  parser = source.raw_parser()
  names = [s.name for s in source.feature_specs]
  raw = {
    "user_id": tf.constant(["10", " 10 ", "11", ""]),
    "item_id": tf.constant(["2", "0002", "99", "1"]),
  }
  parsed = parser.parse_raw(raw, names)["categorical"]
  assert parsed["user_id"].numpy().tolist() == [3, 3, 0, 0]
  for side in ("user_age", "user_gender", "user_occupation", "user_zip"):
    assert parsed[side].numpy().tolist()[2:] == [0, 0], side
  assert parsed["item_id"].numpy().tolist() == [2, 0, 0, 1]
  assert parsed["item_genres"].to_list() == [[1], [0], [0], [2, 3, 4]]
  unknown = parser.unknown(raw)
  assert unknown["user_id"].numpy().tolist() == [False, False, True, True]
  assert unknown["item_id"].numpy().tolist() == [False, True, True, False]
  raw_ids = parser.raw_ids("item_id", tf.constant([[1, 2, 3, 0]])).numpy()
  assert raw_ids.tolist() == [[b"1", b"2", b"3", b""]]
  users = parser.raw_ids("user_id", tf.constant([3, 0])).numpy().tolist()
  assert users == [b"10", b""]  # id 3, as parsed above
  assert parser.raw_ids("user_age", tf.constant([1])) is None


def test_synthetic_sources_have_no_raw_parser():
  assert SyntheticCTR().raw_parser() is None
