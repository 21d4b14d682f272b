"""`k`, the candidates per query of a retrieval export's top-k signatures.

`export(..., k=-3)` failed in TF's TopKV2 after the corpus was embedded;
`recsys export` had no `--k` (always 100, undocumented). Now k is checked
before any work (a positive int, retrieval only), may not exceed the corpus
(refused, naming its size; left out it is 100 or the whole corpus if
smaller), and `recsys export --k` sets it.
"""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli, config
from recsys.serving import export as export_lib
from tests.cli_runs import run_recsys
from tests.reliability.test_serving_batch_sizes import (
  NUM_ITEMS,
  movielens_trainer,
)

TOP_K = ("serving_default", "serving_raw", "top_k", "top_k_raw")


def _top_k(signatures):
  """Each top-k signature's candidate ids and scores for users "1", "2"."""
  users = {
    "serving_default": {"user_id": tf.constant([1, 2], tf.int64)},
    "serving_raw": {"user_id": tf.constant(["1", "2"])},
  }
  users["top_k"] = dict(
    users["serving_default"], exclude_seen=tf.constant([True, False])
  )
  users["top_k_raw"] = dict(
    users["serving_raw"], exclude_seen=tf.constant([True, False])
  )
  out = {}
  for name in TOP_K:
    got = signatures[name](**users[name])
    out[name] = (got["candidate_ids"].numpy(), got["scores"].numpy())
  return out


@pytest.fixture(scope="module")
def retrieval(tmp_path_factory):
  """An untrained two-tower on 17 items and its default export's top k."""
  root = tmp_path_factory.mktemp("k")
  trainer = movielens_trainer(
    root, "retrieval", features=["user_id", "item_id"]
  )
  path = export_lib.export(trainer.run, str(root / "default"))
  return trainer, root, _top_k(tf.saved_model.load(path).signatures)


@pytest.mark.parametrize("k", [-3, 0, True, 2.5, "5"])
def test_a_k_that_is_not_a_positive_int_is_refused_before_any_work(
  retrieval, monkeypatch, k
):
  trainer, root, _ = retrieval

  def embeds(*args):
    raise AssertionError("the corpus was embedded before k was checked")

  monkeypatch.setattr(trainer.run, "index_corpus", embeds)
  target = root / f"bad_{k}"
  with pytest.raises(export_lib.ExportConfigError) as e:
    export_lib.export(trainer.run, str(target), k=k)
  assert f"export: k={k!r} is not a positive integer" in str(e.value)
  assert "candidates the top-k signatures return per query" in str(e.value)
  assert not target.exists()


def test_k_is_at_most_the_corpus_and_sets_every_top_k_signature(retrieval):
  trainer, root, default = retrieval
  with pytest.raises(export_lib.ExportConfigError) as e:
    export_lib.export(trainer.run, str(root / "above"), k=NUM_ITEMS + 1)
  assert (
    f"k={NUM_ITEMS + 1} is more than the {NUM_ITEMS} candidates of the "
    f"corpus" in str(e.value)
  )
  assert not (root / "above").exists()
  for name in TOP_K:  # left out: the whole corpus of 17 (fewer than 100)
    assert default[name][0].shape == (2, NUM_ITEMS), name
  path = export_lib.export(trainer.run, str(root / "k5"), k=5)
  got = _top_k(tf.saved_model.load(path).signatures)
  for name in TOP_K:  # the best 5 of the same ranking
    ids, scores = got[name]
    assert ids.shape == scores.shape == (2, 5), name
    np.testing.assert_array_equal(ids, default[name][0][:, :5], err_msg=name)
    np.testing.assert_allclose(scores, default[name][1][:, :5], rtol=1e-6)


def test_k_for_a_ranking_model_is_refused(tmp_path):
  trainer = movielens_trainer(
    tmp_path, "ranking", features=["user_id", "item_id"]
  )
  with pytest.raises(export_lib.ExportConfigError) as e:
    export_lib.export(trainer.run, str(tmp_path / "export"), k=5)
  assert "DCNv2 is a ranking model" in str(e.value)
  assert not (tmp_path / "export").exists()


def test_recsys_export_refuses_a_k_that_is_not_a_positive_int(tmp_path):
  result = run_recsys(
    "export",
    "--model_dir",
    str(tmp_path / "run"),
    "--export_dir",
    str(tmp_path / "export"),
    "--k",
    "-3",
  )
  assert result.returncode == 2, result.stderr
  assert "argument --k: '-3' is not a positive integer" in result.stderr


# ~25 s: trains a two-tower 2 steps, exports it in a fresh process
@pytest.mark.slow
def test_recsys_export_k(tmp_path, capsys):
  from recsys.testing.movielens import write_ml100k_like  # noqa: PLC0415

  data = write_ml100k_like(
    str(tmp_path / "ml"), num_users=12, num_items=NUM_ITEMS, num_ratings=120
  )
  model_dir = str(tmp_path / "run")
  bindings = [
    f"MOVIELENS_DIR = '{data}'",
    "MovieLens.features = ['user_id', 'item_id']",
    "TwoTower.query_tower = (5,)",
    "TwoTower.candidate_tower = (5,)",
    "EmbeddingSettings.dim = 4",
    "train.global_batch_size = 8",
    "train.eval_batch_size = 8",
    "train.train_steps = 2",
    "train.steps_per_loop = 1",
    "train.summaries = False",
  ]
  gin_file = os.path.join(config.EXPERIMENTS_DIR, "movielens_retrieval.gin")
  argv = ["train", "--gin_file", gin_file, "--model_dir", model_dir]
  argv += sum((["--gin_bindings", b] for b in bindings), [])
  assert cli.main([*argv, "--no_progress"]) == 0
  gin.clear_config()

  export_dir = str(tmp_path / "export")
  export = ["export", "--model_dir", model_dir, "--export_dir", export_dir]
  result = run_recsys(*export, "--k", "3")
  assert result.returncode == 0, result.stderr
  got = _top_k(tf.saved_model.load(export_dir).signatures)
  for name in TOP_K:
    assert got[name][0].shape == (2, 3), name

  capsys.readouterr()
  assert (
    cli.main([*export, "--k", str(NUM_ITEMS + 1)]) == 2
  )  # a setting that cannot be: exit 2, as every command
  assert (
    f"ExportConfigError: export: k={NUM_ITEMS + 1} is more than the "
    f"{NUM_ITEMS} candidates of the corpus" in capsys.readouterr().err
  )
  # The refused export left the previous one as it was.
  got = _top_k(tf.saved_model.load(export_dir).signatures)
  assert got["serving_raw"][0].shape == (2, 3)
