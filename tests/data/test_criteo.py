"""CriteoTSV on small files the tests write: exact values, layouts, gzip, errors, sharding."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import (
  CATEGORICAL_NAMES,
  MLPERF_VOCAB_SIZES,
  CriteoConfigError,
  CriteoTSV,
  DatasetNotFoundError,
)
from recsys.errors import SettingsError

V = 23


def make_rows(n, start=0):
  """n Criteo rows as (label, 13 dense strings, 26 categorical strings)."""
  rng = np.random.default_rng(start)
  rows = []
  for i in range(start, start + n):
    dense = [str(x) for x in rng.integers(-2, 500, 13)]
    dense[i % 13] = ""  # a missing integer
    cats = [f"{x:08x}" for x in rng.integers(0, 1 << 32, 26)]
    cats[(i * 7) % 26] = ""  # a missing categorical
    rows.append((str(i % 2), dense, cats))
  return rows


def to_line(row):
  label, dense, cats = row
  return "\t".join(([label] if label is not None else []) + dense + cats)


def write(path, rows, compress=False):
  text = "".join(to_line(r) + "\n" for r in rows)
  if compress:
    with gzip.open(path, "wt") as f:
      f.write(text)
  else:
    with open(path, "w") as f:
      f.write(text)
  return str(path)


def reference(rows, vocab=V):
  """Labels, dense and ids by the documented conventions, computed independently."""
  labels = np.array([float(r[0]) for r in rows], np.float32)
  dense = np.array(
    [[np.log1p(max(float(x or 0), 0.0)) for x in r[1]] for r in rows],
    np.float32,
  )
  ids = {}
  for j, name in enumerate(CATEGORICAL_NAMES):
    values = [r[2][j] for r in rows]
    hashed = (
      tf.strings.to_hash_bucket_fast(tf.constant(values), vocab - 1).numpy() + 1
    )
    ids[name] = np.where(np.array(values) == "", 0, hashed)
  return labels, dense, ids


def collect(dataset):
  labels, dense, ids = [], [], {n: [] for n in CATEGORICAL_NAMES}
  for features, l in dataset:
    labels.append(l.numpy())
    dense.append(features["dense"].numpy())
    for n in CATEGORICAL_NAMES:
      ids[n].append(features["categorical"][n].numpy())
  return (
    np.concatenate(labels),
    np.concatenate(dense),
    {n: np.concatenate(v) for n, v in ids.items()},
  )


def assert_same(got, want):
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
  for name in CATEGORICAL_NAMES:
    np.testing.assert_array_equal(got[2][name], want[2][name], err_msg=name)


def test_kaggle_layout_exact_values(tmp_path):
  rows = make_rows(11)
  write(tmp_path / "train.txt", rows)
  write(tmp_path / "val.txt", make_rows(4, start=100))
  source = CriteoTSV(
    data_dir=str(tmp_path), layout="kaggle", vocab_sizes=V, chunk_size=4
  )
  assert source.num_dense == 13
  assert [s.name for s in source.feature_specs] == list(CATEGORICAL_NAMES)
  assert all(
    s.vocabulary_size == V and not s.multi_hot for s in source.feature_specs
  )
  features, labels = next(iter(source.dataset(3, training=False)))
  assert (
    features["dense"].shape == (3, 13) and features["dense"].dtype == tf.float32
  )
  c1 = features["categorical"]["C1"]
  assert c1.shape == (3,) and c1.dtype == tf.int64
  assert labels.shape == (3,) and labels.dtype == tf.float32
  assert_same(
    collect(source.dataset(3, training=False, drop_remainder=False)),
    reference(make_rows(4, start=100)),
  )
  in_order = CriteoTSV(
    train_files=str(tmp_path / "train.txt"), vocab_sizes=V, chunk_size=4
  )
  assert_same(
    collect(in_order.dataset(5, repeat=False, drop_remainder=False)),
    reference(rows),
  )


def test_terabyte_layout_plain_and_gzip(tmp_path):
  day0, day1, day23 = (
    make_rows(7),
    make_rows(6, start=7),
    make_rows(5, start=50),
  )
  write(tmp_path / "day_0", day0)
  write(tmp_path / "day_1.gz", day1, compress=True)
  write(tmp_path / "day_23.gz", day23, compress=True)
  source = CriteoTSV(
    data_dir=str(tmp_path),
    layout="terabyte",
    train_days=(0, 1),
    vocab_sizes=V,
    shuffle_files=False,
    cycle_length=1,
  )
  assert [os.path.basename(f) for f in source.train_files] == [
    "day_0",
    "day_1.gz",
  ]
  assert [os.path.basename(f) for f in source.eval_files] == ["day_23.gz"]
  assert_same(
    collect(source.dataset(4, repeat=False, drop_remainder=False)),
    reference(day0 + day1),
  )
  assert_same(
    collect(source.dataset(4, training=False, drop_remainder=False)),
    reference(day23),
  )
  # The same lines plain and gzipped parse identically.
  write(tmp_path / "plain", day23)
  plain = CriteoTSV(train_files=str(tmp_path / "plain"), vocab_sizes=V)
  assert_same(
    collect(plain.dataset(4, repeat=False, drop_remainder=False)),
    reference(day23),
  )


def test_vocabulary_files_and_presets(tmp_path):
  rows = make_rows(6)
  write(tmp_path / "train.txt", rows)
  vocab_dir = tmp_path / "vocab"
  vocab_dir.mkdir()
  known = [rows[0][2][0], rows[1][2][0], rows[2][2][0]]
  (vocab_dir / "C1.txt").write_text("\n".join(v for v in known if v) + "\n")
  source = CriteoTSV(
    train_files=str(tmp_path / "train.txt"),
    vocab_dir=str(vocab_dir),
    vocab_sizes="mlperf",
    max_vocab_size=1000,
  )
  sizes = {s.name: s.vocabulary_size for s in source.feature_specs}
  lookup = {v: i + 1 for i, v in enumerate(v for v in known if v)}
  assert sizes["C1"] == len(lookup) + 1
  assert sizes["C6"] == MLPERF_VOCAB_SIZES[5] == 3 and sizes["C2"] == 1000
  got = collect(source.dataset(6, repeat=False, drop_remainder=False))
  np.testing.assert_array_equal(
    got[2]["C1"], [lookup.get(r[2][0], 0) for r in rows]
  )
  assert len(MLPERF_VOCAB_SIZES) == 26


def test_has_label_false(tmp_path):
  rows = [(None, d, c) for _, d, c in make_rows(3)]
  write(tmp_path / "test.txt", rows)
  source = CriteoTSV(
    train_files=str(tmp_path / "test.txt"), has_label=False, vocab_sizes=V
  )
  labels, dense, ids = collect(source.dataset(3, repeat=False))
  want = reference([("0", d, c) for _, d, c in rows])
  np.testing.assert_array_equal(labels, 0.0)
  np.testing.assert_allclose(dense, want[1], rtol=1e-6)
  np.testing.assert_array_equal(ids["C26"], want[2]["C26"])


@pytest.mark.parametrize(
  "bad,reason",
  [
    ("1\t2\t3", "wrong number of tab-separated columns"),
    (to_line(("2",) + make_rows(1)[0][1:]), "label is not 0 or 1"),
    (
      to_line(("1", ["x1"] + make_rows(1)[0][1][1:], make_rows(1)[0][2])),
      "not an integer",
    ),
  ],
)
def test_malformed_line_fails_with_file_and_line(tmp_path, bad, reason):
  lines = [to_line(r) for r in make_rows(9)]
  lines.insert(7, bad)  # line 8, in the third chunk of 3
  path = tmp_path / "day_5"
  path.write_text("\n".join(lines) + "\n")
  source = CriteoTSV(train_files=str(path), vocab_sizes=V, chunk_size=3)
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    collect(source.dataset(4, repeat=False))
  message = str(info.value)
  assert (
    f"{path}:8" in message
    and reason in message
    and "set malformed to skip" in message
  )


def test_skip_policy_counts_and_reports(tmp_path, caplog):
  rows = make_rows(10)
  lines = [to_line(r) for r in rows]
  lines[2] = "garbage"
  lines[6] = lines[6].replace("\t", "\tx", 1)
  path = tmp_path / "train.txt"
  path.write_text("\n".join(lines) + "\n")
  source = CriteoTSV(
    train_files=str(path), vocab_sizes=V, malformed="skip", chunk_size=4
  )
  with caplog.at_level("WARNING", logger="recsys.data.criteo"):
    got = collect(source.dataset(3, repeat=False, drop_remainder=False))
  kept = [r for i, r in enumerate(rows) if i not in (2, 6)]
  assert_same(got, reference(kept))
  assert source.malformed_lines() == 2
  assert [(f, n) for f, n, _ in source.skipped.first] == [
    (str(path), 3),
    (str(path), 7),
  ]
  assert "skipped 2 malformed Criteo line(s)" in caplog.text


@pytest.mark.parametrize("num_files,chunk", [(3, 4096), (1, 2)])
def test_two_input_pipelines_cover_every_line_once(tmp_path, num_files, chunk):
  rows = make_rows(17)
  parts = np.array_split(np.arange(17), num_files)
  files = [
    write(tmp_path / f"day_{i}", [rows[j] for j in part])
    for i, part in enumerate(parts)
  ]
  source = CriteoTSV(train_files=files, vocab_sizes=V, chunk_size=chunk)
  seen = []
  for pipeline in range(2):
    ctx = tf.distribute.InputContext(2, pipeline, 2)
    labels, _, ids = collect(
      source.dataset(3, input_context=ctx, repeat=False, drop_remainder=False)
    )
    seen += list(zip(labels, *(ids[n] for n in CATEGORICAL_NAMES)))
  labels, _, ids = reference(rows)
  want = list(zip(labels, *(ids[n] for n in CATEGORICAL_NAMES)))
  assert len(set(want)) == 17 and sorted(seen) == sorted(want)


def test_training_repeats_and_drops_remainder(tmp_path):
  write(tmp_path / "train.txt", make_rows(7))
  source = CriteoTSV(train_files=str(tmp_path / "train.txt"), vocab_sizes=V)
  sizes = [l.shape[0] for _, l in source.dataset(3).take(6)]
  assert sizes == [3] * 6


def test_missing_files_are_clear(tmp_path):
  with pytest.raises(DatasetNotFoundError, match="day_23 for evaluation"):
    CriteoTSV(data_dir=str(tmp_path / "nope"), layout="terabyte")
  with pytest.raises(DatasetNotFoundError, match="train.txt"):
    CriteoTSV(data_dir=str(tmp_path), layout="kaggle")
  with pytest.raises(DatasetNotFoundError, match="no Criteo file matches"):
    CriteoTSV(train_files=str(tmp_path / "*.tsv"))
  write(tmp_path / "train.txt", make_rows(2))
  source = CriteoTSV(data_dir=str(tmp_path))
  with pytest.raises(DatasetNotFoundError, match="no evaluation files"):
    source.dataset(2, training=False)
  with pytest.raises(SettingsError, match="CriteoTSV.layout must be one of"):
    CriteoTSV(data_dir=str(tmp_path), layout="1tb")
  with pytest.raises(CriteoConfigError, match="26 categorical"):
    CriteoTSV(data_dir=str(tmp_path), vocab_sizes=[5] * 25)
