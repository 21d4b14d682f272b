"""`recsys export`'s raw-feature signatures, served where recsys is not importable.

Criteo and MovieLens files are written to tmp, a model trains two steps
through the CLI and is exported; a separate Python process (one for the
module) that cannot import `recsys` (or `backends`) and runs from another
directory without PYTHONPATH loads the SavedModel and sends the same rows twice:
as raw values through "serving_raw", and as the ids the training pipeline
made of them through the id signature. The two must agree (rtol 1e-6).
The serving process is the session's (`serving_process`,
`tests/serving_process.py`): test_export_history and test_serving_batch_sizes
serve from it too.
"""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import config
from recsys.data import CATEGORICAL_NAMES
from recsys.data.criteo_raw import DENSE_NAMES
from tests.cli_runs import train_and_export, train_bindings
from tests.data.test_criteo import make_rows, write
from tests.data.test_movielens import write_ml100k

# Tricky Criteo values: negatives, missing, huge counts, values in and out of
# the C1/C2 vocabulary files, a row of empty categoricals.
_TRICKY = [
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
      "2",
      "9",
    ],
    ["aaaa0001", "bbbb0002"] + [f"{j:08x}" for j in range(24)],
  ),
  ("0", [""] * 13, [""] * 26),
  (
    "1",
    ["9223372036854775807"] + ["1"] * 12,  # int64 max
    ["ffffffff", "notinvoc"] + ["68fd1e64"] * 24,
  ),
]


def _train_and_export(tmp_path, gin_file, bindings):
  model_dir, export_dir = str(tmp_path / "run"), str(tmp_path / "export")
  tiny = [
    *train_bindings(
      global_batch_size=8,
      train_steps=2,
      steps_per_loop=1,
      eval_steps=1,
      summaries=False,
      eval_batch_size=8,
    ),
    "EmbeddingSettings.dim = 4",
  ]
  gin_file = os.path.join(config.EXPERIMENTS_DIR, gin_file)
  train_and_export(gin_file, tiny + bindings, model_dir, export_dir)
  return model_dir, export_dir


def _source(model_dir):
  """The trained run's data source, rebuilt from its operative config."""
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  config.parse(
    [os.path.join(model_dir, "operative_config.gin")],
    ["train.progress_bar = False", "train.summaries = False"],
  )
  source = train(model_dir=model_dir, action="build").run.source
  gin.clear_config()
  return source


def _padded(ids, width):
  if isinstance(ids, tf.RaggedTensor):
    return ids.to_tensor(default_value=-1, shape=[None, width]).numpy()
  return ids.numpy()


def _first_nine(model_dir):
  """The trained run's first 9 evaluation examples: its source, their
  features, the specs by name and the categorical ids padded to max_ids."""
  source = _source(model_dir)
  features, _ = next(
    iter(source.dataset(9, training=False, drop_remainder=False, repeat=False))
  )
  specs = {s.name: s for s in source.feature_specs}
  ids = {
    n: _padded(v, specs[n].max_ids) for n, v in features["categorical"].items()
  }
  return source, features, specs, ids


# ~25 s (first test: the serving process starts): DCN-v2 on Criteo
@pytest.mark.slow
def test_criteo_raw_signature_scores_like_the_id_signature(
  tmp_path, serving_process
):
  data, vocab = tmp_path / "criteo", tmp_path / "vocab"
  data.mkdir()
  vocab.mkdir()
  rows = make_rows(24)
  write(data / "train.txt", rows)
  eval_rows = _TRICKY + make_rows(5, start=100)
  write(data / "val.txt", eval_rows)
  (vocab / "C1.txt").write_text("aaaa0001\nffffffff\n")
  (vocab / "C2.txt").write_text("bbbb0002\n" + rows[0][2][1] + "\n")
  # DCN-v2 rather than DLRM: DLRM's 27-vector interaction costs ~15 s of
  # tracing.
  model_dir, export_dir = _train_and_export(
    tmp_path,
    "criteo_dcn.gin",
    [
      f"CRITEO_DIR = '{data}'",
      f"CriteoTSV.vocab_dir = '{vocab}'",
      "CriteoTSV.vocab_sizes = 23",
      "DCNv2.num_cross_layers = 1",
      "DCNv2.projection_dim = 2",
      "DCNv2.deep_mlp = (8,)",
    ],
  )

  # The ids the training pipeline makes of the evaluation file's rows.
  source = _source(model_dir)
  features, _ = next(
    iter(
      source.dataset(
        len(eval_rows), training=False, drop_remainder=False, repeat=False
      )
    )
  )
  ids = {
    "dense": features["dense"].numpy(),
    **{n: features["categorical"][n].numpy() for n in CATEGORICAL_NAMES},
  }
  raw = {
    name: np.array([r[1][k] for r in eval_rows])
    for k, name in enumerate(DENSE_NAMES)
  }
  raw.update(
    {
      name: np.array([r[2][k] for r in eval_rows])
      for k, name in enumerate(CATEGORICAL_NAMES)
    }
  )

  got = serving_process.serve(
    tmp_path,
    export_dir,
    {"ids": ("serving_default", ids), "raw": ("serving_raw", raw)},
  )
  assert got["raw"]["scores"].shape == (len(eval_rows),)
  np.testing.assert_allclose(
    got["raw"]["scores"], got["ids"]["scores"], rtol=1e-6
  )
  # Out of vocabulary (vocabulary files): id 0 like a missing value, and
  # flagged.
  assert ids["C1"][:3].tolist() == [1, 0, 2] and ids["C2"][2] == 0
  assert got["raw"]["unknown_C1"][:3].tolist() == [False, False, False]
  assert got["raw"]["unknown_C2"][:3].tolist() == [False, False, True]
  assert sorted(k for k in got["raw"] if k.startswith("unknown_")) == [
    "unknown_C1",
    "unknown_C2",
  ]
  # A dense value the reader would refuse is refused, naming column and row.
  raw["I4"] = np.array(
    ["1.5" if row == 1 else v for row, v in enumerate(raw["I4"])]
  )
  error = serving_process.serve(
    tmp_path, export_dir, {"raw": ("serving_raw", raw)}, expect_error=True
  )
  assert "raw feature I4 got [1.5] at row 1" in error
  raw["I4"][1] = "7"

  # Issue 28: what a TSV column cannot hold, a count beyond int64, inputs
  # of other shapes and ids beyond a vocabulary: each refused by name.
  def refused(signature, inputs):
    return serving_process.serve(
      tmp_path, export_dir, {"x": (signature, inputs)}, expect_error=True
    )

  n = len(eval_rows)
  assert "raw feature C5 got [a\\\\tb] at row 2" in refused(
    "serving_raw", {**raw, "C5": np.array(["x", "y", "a\tb"] + [""] * (n - 3))}
  )
  assert "raw feature I2 got [9223372036854775808] at row 0" in refused(
    "serving_raw",
    {**raw, "I2": np.array(["9223372036854775808"] + [""] * (n - 1))},
  )
  error = refused("serving_raw", {**raw, "C1": raw["C1"][:-1]})
  assert f"serving inputs of shapes C1 [{n - 1}], C10 [{n}]," in error
  assert "expected C1 [B], C10 [B]," in error and "one batch size B" in error
  error = refused("serving_raw", {**raw, "I1": raw["I1"][:, None]})
  assert f"I1 [{n}, 1]," in error and "I1 [B]," in error
  error = refused("serving_default", {**ids, "dense": ids["dense"][:, :12]})
  assert f"dense [{n}, 12]" in error and "expected C1 [B]," in error
  assert "dense [B, 13]" in error
  bad_ids = ids["C3"].copy()
  bad_ids[1] = 99999
  error = refused("serving_default", {**ids, "C3": bad_ids})
  assert (
    "feature C3 (table C3, vocabulary_size=23) got id 99999 at batch row 1; "
    "ids must be in [0, 23)" in error
  )


def _ml100k(folder, newest=()):
  """ml-100k files: 3 users x 3 items rated 4 times, timestamps increasing by
  line, then the `newest` (user, item) pairs."""
  pairs = [(u, i) for u in (1, 2, 10) for i in (1, 2, 3)] * 4 + list(newest)
  ratings = [
    (u, i, 1 + (u * 7 + i * 3 + n) % 5, 881250000 + 1000 * n)
    for n, (u, i) in enumerate(pairs)
  ]
  return write_ml100k(folder, ratings), ratings


def _train_on_ml100k(tmp_path, gin_file, bindings, newest=()):
  """Trains and exports `gin_file` on `_ml100k`'s files, a quarter of them
  for testing: (the ratings, model dir, export dir)."""
  data, ratings = _ml100k(tmp_path / "ml-100k", newest)
  model_dir, export_dir = _train_and_export(
    tmp_path,
    gin_file,
    [f"MOVIELENS_DIR = '{data}'", "MovieLens.test_fraction = 0.25", *bindings],
  )
  return ratings, model_dir, export_dir


@pytest.mark.slow  # ~10 s: trains and exports DCN-v2 on MovieLens
def test_movielens_ranking_raw_signature_scores_like_the_id_signature(
  tmp_path, serving_process
):
  # Item 4 is rated once, last: in the temporal test split only, so its
  # embedding row is never trained (issue 28: flagged unknown).
  ratings, model_dir, export_dir = _train_on_ml100k(
    tmp_path,
    "movielens_ranking.gin",
    [
      "MovieLens.timestamp_buckets = 3",
      "MovieLens.split = 'temporal'",
      "DCNv2.deep_mlp = (8,)",
      "DCNv2.projection_dim = 2",
    ],
    newest=[(1, 4)],
  )
  # The temporal split's test ratings are the newest 9 of 37: the file's last
  # 9 lines.
  source, features, specs, ids = _first_nine(model_dir)
  assert "timestamp" in specs and "item_genres" in specs and "user_zip" in specs
  tested = ratings[-9:]
  raw = {
    "user_id": np.array([str(u) for u, _, _, _ in tested] + ["424242", " 2 "]),
    "item_id": np.array([str(i) for _, i, _, _ in tested] + ["3", "999"]),
    "timestamp": np.array([t for _, _, _, t in tested] + [0, 2**40], np.int64),
  }
  # The two rows not in the files, by the documented rules: an unknown user is
  # id 0 with side features 0; item 3 has no genre ([0]); the earliest time is
  # bucket 1, the latest bucket 3; an unknown item is id 0 with genres [0].
  no_genre = np.array([[0] + [-1] * (specs["item_genres"].max_ids - 1)])
  new_user = {n: np.zeros_like(ids[n][:1]) for n in ids}
  new_user.update(
    item_id=np.array([3]), item_genres=no_genre, timestamp=np.array([1])
  )
  row = int(np.flatnonzero(ids["user_id"] == 2)[0])  # user "2" has id 2
  new_item = {n: ids[n][row : row + 1].copy() for n in ids}
  new_item.update(
    item_id=np.array([0]), item_genres=no_genre, timestamp=np.array([3])
  )
  ids = {n: np.concatenate([ids[n], new_user[n], new_item[n]]) for n in ids}

  got = serving_process.serve(
    tmp_path,
    export_dir,
    {"ids": ("serving_default", ids), "raw": ("serving_raw", raw)},
  )
  assert got["raw"]["scores"].shape == (11,)
  np.testing.assert_allclose(
    got["raw"]["scores"], got["ids"]["scores"], rtol=1e-6
  )
  assert got["raw"]["unknown_user_id"].tolist() == [False] * 9 + [True, False]
  assert got["raw"]["unknown_item_id"].tolist() == [False] * 8 + [
    True,  # item 4: in the files, but only in the test split
    False,
    True,
  ]

  # Issue 28's red-team calls: user_id and item_id of different lengths,
  # 2-D ids. Each refused at the entrance, naming the inputs' shapes.
  def refused(inputs):
    return serving_process.serve(
      tmp_path, export_dir, {"x": ("serving_raw", inputs)}, expect_error=True
    )

  error = refused({**raw, "item_id": raw["item_id"][:1]})
  assert "serving inputs of shapes item_id [1], timestamp [11], " in error
  assert "user_id [11]; expected item_id [B], timestamp [B], user_id [B]" in (
    error
  )
  error = refused({**raw, "user_id": raw["user_id"][:, None]})
  assert "user_id [11, 1]; expected" in error


@pytest.mark.slow  # ~10 s: trains and exports a two-tower model on MovieLens
def test_movielens_retrieval_raw_signatures_match_the_id_signatures(
  tmp_path, serving_process
):
  _, model_dir, export_dir = _train_on_ml100k(
    tmp_path,
    "movielens_retrieval.gin",
    [
      "TwoTower.query_tower = (5,)",
      "TwoTower.candidate_tower = (5,)",
    ],
  )
  source, features, specs, ids = _first_nine(model_dir)
  # Raw ids by the documented rule: raw ids sorted numerically -> 1, 2, 3.
  users = np.array(["", "1", "2", "10"])[ids["user_id"]]
  items = np.array(["", "1", "2", "3"])[ids["item_id"]]
  query = {n: ids[n] for n in source.query_features}
  candidate = {n: ids[n] for n in source.candidate_features}

  got = serving_process.serve(
    tmp_path,
    export_dir,
    {
      "top": ("serving_default", query),
      "raw_top": ("serving_raw", {"user_id": users}),
      "c": ("candidate_embeddings", candidate),
      "raw_c": ("raw_candidate_embeddings", {"item_id": items}),
      "q": ("query_embeddings", query),
      "raw_q": ("raw_query_embeddings", {"user_id": users}),
    },
  )
  np.testing.assert_allclose(
    got["raw_q"]["embeddings"], got["q"]["embeddings"], rtol=1e-6
  )
  np.testing.assert_allclose(
    got["raw_c"]["embeddings"], got["c"]["embeddings"], rtol=1e-6
  )
  np.testing.assert_allclose(
    got["raw_top"]["scores"], got["top"]["scores"], rtol=1e-6
  )
  np.testing.assert_array_equal(
    got["raw_top"]["candidate_ids"], got["top"]["candidate_ids"]
  )
  # Candidate ids 1, 2, 3 are the raw movie ids "1", "2", "3".
  raw_ids = got["raw_top"]["candidate_raw_ids"].astype(str)
  np.testing.assert_array_equal(
    raw_ids, got["top"]["candidate_ids"].astype(str)
  )
