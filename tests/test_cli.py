"""The `recsys` command: help, gin errors with their file, train/evaluate/export."""

import json
import os
import subprocess
import sys
import textwrap

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli
from recsys import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")
TINY = ["train.global_batch_size = 64", "train.train_steps = 6",
        "train.steps_per_loop = 3", "train.eval_steps = 2",
        "SyntheticCTR.oracle_examples = 4096"]


def run_recsys(*args, timeout=300):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "recsys", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [[], ["train"], ["evaluate"], ["export"], ["info"]])
def test_help(command, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(command + ["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "usage: recsys" in out
  if command:
    assert "example:" in out
  if command in (["train"], ["evaluate"]):
    assert "--gin_file" in out and "--gin_bindings" in out and "--model_dir" in out


def test_unknown_gin_parameter_names_the_file(tmp_path, capsys):
  bad = tmp_path / "bad.gin"
  bad.write_text("include 'base.gin'\ntrain.global_batch = 64\n")
  code = cli.main(["train", "--gin_file", str(bad), "--model_dir", str(tmp_path / "m")])
  err = capsys.readouterr().err
  assert code == 2
  assert "global_batch" in err and str(bad) in err and "line 2" in err


def test_missing_required_macro_names_the_file_that_declares_it(tmp_path, capsys):
  code = cli.main(["train", "--gin_file",
                   os.path.join(config.EXPERIMENTS_DIR, "criteo_dlrm.gin"),
                   "--model_dir", str(tmp_path)])
  err = capsys.readouterr().err
  assert code == 2
  assert "CRITEO_DIR" in err and "criteo_kaggle.gin:" in err
  assert "--gin_bindings" in err


def test_missing_required_train_argument_names_the_files(tmp_path, capsys):
  only_base = os.path.join(config.EXPERIMENTS_DIR, "base.gin")
  code = cli.main(["train", "--gin_file", only_base, "--model_dir", str(tmp_path)])
  err = capsys.readouterr().err
  assert code == 2
  assert "train" in err and "data" in err and "base.gin" in err


def test_info_prints_strategy_and_backend_choice(capsys):
  assert cli.main(["info"]) == 0
  out = capsys.readouterr().out
  assert "embedding backend: auto -> tensorcore" in out and "TensorFlow" in out
  assert "fused CPU kernels (tensorcore on CPU): " in out


def test_info_plans_the_experiment_tables_with_its_optimizer(capsys):
  assert cli.main(["info", "--gin_file", "experiments/synthetic_dlrm.gin",
                   "--gin_bindings", "EmbeddingSettings.dim = 8",
                   "--gin_bindings", "train.embedding_optimizer = @embedding.FTRL()"]) == 0
  out = capsys.readouterr().out
  # C4: 10000 x 8 floats = 312.5 KiB, FTRL keeps two slots of the same size.
  assert "C4     10000  8    FTRL       2      312.5 KiB  625.0 KiB  937.5 KiB" in out


def _padded(ids, width):
  """Ragged/dense ids -> the export's `[B, W]` padded with -1 (or `[B]`)."""
  if isinstance(ids, tf.RaggedTensor):
    return ids.to_tensor(default_value=-1, shape=[None, width]).numpy()
  return ids.numpy()


@pytest.mark.slow  # ~40 s: three recsys processes (train, evaluate, export) and a loader
def test_train_evaluate_export_and_serve_in_a_fresh_process(tmp_path):
  model_dir, export_dir = tmp_path / "run", tmp_path / "export"
  bindings = sum((["--gin_bindings", b] for b in TINY), [])
  done = run_recsys("train", "--gin_file", DEFAULT, *bindings,
                    "--model_dir", str(model_dir), "--no_progress")
  assert done.returncode == 0, done.stderr[-3000:]
  metrics = json.loads((model_dir / "metrics.json").read_text())
  assert metrics["step"] == 6

  done = run_recsys("evaluate", "--model_dir", str(model_dir))
  assert done.returncode == 0, done.stderr[-3000:]
  evaluated = json.loads((model_dir / "eval_metrics.json").read_text())
  np.testing.assert_allclose(evaluated["eval/auc"], metrics["eval/auc"], rtol=1e-6)

  done = run_recsys("export", "--model_dir", str(model_dir),
                    "--export_dir", str(export_dir))
  assert done.returncode == 0, done.stderr[-3000:]
  # Synthetic data has no raw form: the export says it has only id signatures.
  assert "no raw-feature signature: SyntheticCTR has no raw form" in done.stderr
  assert "exported signatures: serving_default\n" in done.stderr

  # Reference predictions in this process, from the checkpoint, through the
  # tensorcore backend's lookups (not the export's serving lookups).
  from recsys.training import train  # pylint: disable=g-import-not-at-top
  config.parse([str(model_dir / "operative_config.gin")],
               ["train.progress_bar = False", "train.summaries = False"])
  trainer = train(model_dir=str(model_dir), action="build")
  assert trainer.restored_step == 6
  features, _ = next(iter(trainer.source.dataset(13, training=False)))
  names = list(trainer.feature_config)
  acts = trainer.backend.lookup({n: features["categorical"][n] for n in names})
  want = trainer.model(acts, features).numpy()

  specs = {s.name: s for s in trainer.source.feature_specs}
  inputs = {"dense": features["dense"].numpy()}
  for n in names:
    inputs[n] = _padded(features["categorical"][n], specs[n].max_ids)
  np.savez(tmp_path / "inputs.npz", **inputs)
  loader = textwrap.dedent(f"""
      import numpy as np, tensorflow as tf
      served = tf.saved_model.load({str(export_dir)!r}).signatures["serving_default"]
      inputs = dict(np.load({str(tmp_path / "inputs.npz")!r}))
      scores = served(**{{k: tf.constant(v) for k, v in inputs.items()}})["scores"]
      np.save({str(tmp_path / "scores.npy")!r}, scores.numpy())
  """)
  done = subprocess.run([sys.executable, "-c", loader], capture_output=True,
                        text=True, timeout=300,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert done.returncode == 0, done.stderr[-3000:]
  got = np.load(tmp_path / "scores.npy")
  assert got.shape == (13,)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~10 s: trains, exports and loads a two-tower model in-process
def test_export_of_a_retrieval_model_serves_the_models_top_k(tmp_path):
  """Two-tower: the exported tower signatures and top-k equal the trained model's."""
  model_dir, export_dir = str(tmp_path / "run"), str(tmp_path / "export")
  tiny = ["SyntheticRetrieval.num_users = 50", "SyntheticRetrieval.num_items = 37",
          "EmbeddingSettings.dim = 7", "TwoTower.query_tower = (11,)",
          "TwoTower.candidate_tower = (11,)", "train.global_batch_size = 32",
          "train.train_steps = 4", "train.steps_per_loop = 2", "train.eval_steps = 1",
          "train.summaries = False"]
  flags = sum((["--gin_bindings", b] for b in tiny), [])
  two_tower = os.path.join(config.EXPERIMENTS_DIR, "synthetic_two_tower.gin")
  assert cli.main(["train", "--gin_file", two_tower, *flags, "--model_dir", model_dir,
                   "--no_progress"]) == 0
  gin.clear_config()
  assert cli.main(["export", "--model_dir", model_dir, "--export_dir", export_dir]) == 0
  gin.clear_config()

  # Reference: the checkpoint through the training backend's lookups.
  from recsys.training import loop, train  # pylint: disable=g-import-not-at-top
  config.parse([os.path.join(model_dir, "operative_config.gin")],
               ["train.progress_bar = False"])
  trainer = train(model_dir=model_dir, action="build")
  trainer.index_corpus()
  model, names = trainer.model, list(trainer.feature_config)
  features, _ = next(iter(trainer.source.dataset(13, training=False)))
  acts = trainer.backend.lookup(*loop.split_batch((features, None), names))
  want_q = model.query_embeddings(acts, features).numpy()
  want_c = model.candidate_embeddings(acts, features).numpy()
  corpus_ids, corpus = (t.numpy() for t in model.corpus_index.corpus())
  want_scores = np.sort(want_q @ corpus.T, axis=1)[:, ::-1]

  specs = {s.name: s for s in trainer.source.feature_specs}
  inputs = {n: tf.constant(_padded(features["categorical"][n], specs[n].max_ids))
            for n in names}
  loaded = tf.saved_model.load(export_dir)
  query = {n: inputs[n] for n in model.query_features}
  got_q = loaded.signatures["query_embeddings"](**query)["embeddings"].numpy()
  got_c = loaded.signatures["candidate_embeddings"](
      **{n: inputs[n] for n in model.candidate_features})["embeddings"].numpy()
  top = loaded.signatures["serving_default"](**query)
  np.testing.assert_allclose(got_q, want_q, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_c, want_c, rtol=1e-5, atol=1e-6)
  assert top["scores"].shape == (13, 37)
  np.testing.assert_allclose(top["scores"].numpy(), want_scores, rtol=1e-5, atol=1e-6)
  best = corpus_ids[np.argmax(want_q @ corpus.T, axis=1)]
  np.testing.assert_array_equal(top["candidate_ids"].numpy()[:, 0], best)


@pytest.mark.parametrize("given, cores, expected", [
    ((0, 0), 2, (1, 2)),      # small machine, nothing given: 1 / 2
    ((0, 0), 1, (1, 2)),
    ((0, 0), 8, (0, 0)),      # larger machine: TF's defaults
    ((2, 0), 2, (2, 0)),      # a flag given: kept as given
    ((0, 3), 2, (0, 3)),
])
def test_thread_settings(given, cores, expected):
  intra, inter, why = cli.thread_settings(*given, cores)
  assert (intra, inter) == expected
  assert bool(why) == (expected == (1, 2) and given == (0, 0))
