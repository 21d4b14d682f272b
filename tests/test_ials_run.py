"""An ImplicitALS run through the CLI: train, resume, evaluate, export.

On the synthetic ml-100k-like files (`recsys.testing.movielens`; not the
real ml-100k): `recsys train` with experiments/movielens_ials.gin for one
epoch, exported; resumed for a second epoch, exported again. The second
export's tables are the NumPy iALS's epoch (benchmarks/movielens_baselines)
from the first export's tables, and its top_k signature with exclude_seen
ranks the corpus by those tables without the user's training items.
"""

import json
import math
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import movielens_baselines as baselines
from recsys import cli, config
from recsys.data import ials_batches
from recsys.testing import movielens

# The shipped file's kind of weights: lambda_u = REG (ALPHA |I_u| + |I|)^NU.
REG, ALPHA, NU, DIM, BATCH = 0.05, 10.0, 1.0, 8, 32
# Histories of ~25 and ~19 ids in chunks of 1: every row spans several
# entries, and those longer than a batch (32) take steps of their own.
CHUNK = 1


def _run(*argv: str) -> None:
  assert cli.main(list(argv)) == 0
  gin.clear_config()


def _bindings(data_dir: str, steps: int) -> list:
  bindings = [
    f"MOVIELENS_DIR = '{data_dir}'",
    f"ImplicitALSData.batch_size = {BATCH}",
    f"ImplicitALSData.history_chunk = {CHUNK}",
    f"train.global_batch_size = {BATCH}",
    f"EmbeddingSettings.dim = {DIM}",
    f"ImplicitALS.dim = {DIM}",
    f"ImplicitALS.reg = {REG}",
    f"ImplicitALS.alpha = {ALPHA}",
    f"ImplicitALS.reg_exponent = {NU}",
    f"train.train_steps = {steps}",
    "train.steps_per_loop = 1",
    "train.summaries = False",
    "train.eval_batch_size = 64",
    "train.eval_steps = 2",
  ]
  return sum((["--gin_bindings", b] for b in bindings), [])


def _tables(export_dir: str, users: int, items: int):
  loaded = tf.saved_model.load(export_dir)
  p = loaded.signatures["query_embeddings"](
    user_id=tf.range(users, dtype=tf.int64)
  )["embeddings"]
  q = loaded.signatures["candidate_embeddings"](
    item_id=tf.range(items, dtype=tf.int64)
  )["embeddings"]
  return loaded, p.numpy().astype(np.float64), q.numpy().astype(np.float64)


@pytest.mark.slow
def test_ials_run_trains_resumes_evaluates_and_exports(tmp_path):
  data_dir = movielens.write_ml100k_like(
    str(tmp_path / "ml"), num_users=60, num_items=80, num_ratings=1500
  )
  gin_file = os.path.join(config.EXPERIMENTS_DIR, "movielens_ials.gin")
  model_dir = str(tmp_path / "run")
  from recsys.training import train  # noqa: PLC0415 (the CLI's own import)

  config.parse(
    [gin_file],
    [
      f"MOVIELENS_DIR = '{data_dir}'",
      f"ImplicitALSData.batch_size = {BATCH}",
      f"ImplicitALSData.history_chunk = {CHUNK}",
    ],
  )
  source = train(model_dir=str(tmp_path / "probe"), action="build").run.source
  gin.clear_config()
  users, items = source.num_users, source.num_items
  epoch = source.steps_per_epoch()
  # Chunked histories take more entries than rows: more steps per epoch.
  assert epoch > math.ceil(users / BATCH) + math.ceil(items / BATCH)

  exports = []
  for epochs in (1, 2):  # the second run resumes from the first's checkpoint
    flags = _bindings(data_dir, epoch * epochs)
    _run(
      "train",
      "--gin_file",
      gin_file,
      *flags,
      "--model_dir",
      model_dir,
      "--no_progress",
    )
    exports.append(str(tmp_path / f"export{epochs}"))
    _run("export", "--model_dir", model_dir, "--export_dir", exports[-1])
  _run("evaluate", "--model_dir", model_dir, "--exclude_seen")
  # iALS trains no dense weights: no dense optimizer's rate is reported.
  with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
    metrics = json.load(f)
  assert "train/loss" in metrics and "learning_rate" not in metrics

  _, p1, q1 = _tables(exports[0], users, items)
  loaded, p2, q2 = _tables(exports[1], users, items)
  pairs = ials_batches.unique_pairs(
    np.stack(source.training_pairs(), 1), users, items
  )
  by_user = baselines._rows_by_key(pairs[:, 0], pairs[:, 1], users)
  by_item = baselines._rows_by_key(pairs[:, 1], pairs[:, 0], items)
  # Rows longer than a batch's entries were solved in steps of their own.
  assert max(len(h) for h in (*by_user, *by_item)) > BATCH * CHUNK
  want_p = baselines._ials_half_step(q1, by_user, REG, ALPHA, 1.0, NU)
  want_q = baselines._ials_half_step(want_p, by_item, REG, ALPHA, 1.0, NU)
  np.testing.assert_allclose(p2, want_p, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(q2, want_q, rtol=1e-3, atol=1e-5)
  assert not np.allclose(p1, p2, atol=1e-4)

  query = np.arange(1, 11)
  top = loaded.signatures["top_k"](
    user_id=tf.constant(query, tf.int64),
    exclude_seen=tf.ones([len(query)], tf.bool),
  )
  got = top["candidate_ids"].numpy()[:, :10]
  scores = want_p[query] @ want_q[1:].T  # the corpus: items 1..N
  for row, user in enumerate(query):
    scores[row, by_user[user] - 1] = -np.inf
  # The served top 10 score like NumPy's top 10 (the factors agree to
  # 1e-3, so near-ties may swap places; their scores still agree).
  got_scores = np.take_along_axis(scores, got - 1, axis=1)
  want_scores = -np.sort(-scores, axis=1)[:, :10]
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-3, atol=1e-5)
  assert len({tuple(sorted(r)) for r in got}) > 1  # not one list for all


def _refused_train(tmp_path, capsys, *bindings: str) -> str:
  """`recsys train` of the iALS file with `bindings` on small generated
  data: exit status 2, nothing saved; its stderr."""
  data_dir = movielens.write_ml100k_like(
    str(tmp_path / "ml"), num_users=30, num_items=40, num_ratings=1500
  )
  gin_file = os.path.join(config.EXPERIMENTS_DIR, "movielens_ials.gin")
  flags = _bindings(data_dir, 2)
  for binding in bindings:
    flags += ["--gin_bindings", binding]
  code = cli.main(
    ["train", "--gin_file", gin_file, *flags, "--model_dir", str(tmp_path)]
  )
  gin.clear_config()
  assert code == 2
  assert not os.path.exists(os.path.join(str(tmp_path), "checkpoints"))
  return capsys.readouterr().err


@pytest.mark.parametrize("chunk", ["0", "2.5"])
def test_ials_run_refuses_a_chunk_that_is_no_size(chunk, tmp_path, capsys):
  """0 and 2.5 are no number of ids."""
  err = _refused_train(
    tmp_path,
    capsys,
    f"ImplicitALSData.history_chunk = {chunk}",
    "ImplicitALSData.batch_size = 8",
    "train.global_batch_size = 8",
  )
  assert "ImplicitALSData" in err and "history_chunk" in err, err


def test_ials_run_refuses_an_embedding_optimizer_other_than_sgd_1(
  tmp_path, capsys
):
  err = _refused_train(tmp_path, capsys, "embedding.SGD.learning_rate = 0.5")
  assert "ModelConfigError" in err and "has embedding optimizer" in err
  assert "learning rate 1.0" in err
