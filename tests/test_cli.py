"""The `recsys` command: help, gin errors naming files, train/eval/export."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli, config
from recsys.process import threads
from recsys.testing import movielens as movielens_synthetic
from tests.cli_runs import (
  DEFAULT,
  ROOT,
  run_recsys,
  tiny,
  train_and_export,
  train_argv,
  train_bindings,
)
from tests.conftest import without_child_site

TINY = tiny(train_steps=6, steps_per_loop=3, eval_steps=2)


@pytest.mark.parametrize(
  "command", [[], ["train"], ["evaluate"], ["export"], ["info"]]
)
def test_help(command, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(command + ["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "usage: recsys" in out
  if command:
    assert "example:" in out
  else:  # the macros the shipped gin files really require
    assert (
      "CRITEO_DIR = " in out
      and "MOVIELENS_DIR = " in out
      and "CRITEO_TRAIN" not in out
    )
  if command in (["train"], ["evaluate"]):
    assert (
      "--gin_file" in out and "--gin_bindings" in out and "--model_dir" in out
    )


def test_benchmark_help_names_its_command(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["benchmark", "movielens", "--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: recsys benchmark movielens ")
  assert "--seeds" in out and "--holdout" in out and "--synthetic" in out


@pytest.mark.slow
def test_benchmark_movielens_runs_as_a_user_runs_it(tmp_path, capsys):
  """The README's `recsys benchmark movielens --data_dir` (here through
  `recsys.cli.main`; each experiment trains in a fresh child process, as
  the command always does), on small generated ml-100k-layout files (no
  real files here; the full-size generated set makes the baselines'
  searches take minutes), short training."""
  data = movielens_synthetic.write_ml100k_like(
    str(tmp_path / "ml-100k"), num_users=200, num_items=300, num_ratings=12000
  )
  out = tmp_path / "results.json"
  code = cli.main(
    [
      "benchmark",
      "movielens",
      "--data_dir",
      data,
      "--seeds",
      "1",
      "--experiments",
      "fm",
      "implicit_als",
      "--ranking_bindings",
      "train.train_steps = 40",
      "--retrieval_bindings",
      "train.train_steps = 40",
      "--model_root",
      str(tmp_path / "runs"),
      "--json",
      str(out),
    ]
  )
  printed = capsys.readouterr().out
  assert code == 0
  summary = json.loads(out.read_text())["summary"]
  rmse = summary["ranking_rmse"]
  # The planted data has structure any fitted model finds: even 40 steps of
  # the FM beat predicting the global mean.
  assert rmse["movielens_fm.gin"]["mean"] < rmse["global mean"]["mean"]
  for protocol in ("retrieval_hit_rate", "retrieval_hit_rate_excluded"):
    hits = summary[protocol]["movielens_ials.gin"]
    assert 0.0 < hits["top100"]["mean"] <= 1.0
    # Scored again from the exported SavedModel by raw user id: the same.
    served = summary[protocol]["movielens_ials.gin (SavedModel)"]
    for k, rate in hits.items():
      assert served[k]["mean"] == pytest.approx(rate["mean"], abs=1e-3), k
  ials = summary["retrieval_hit_rate"]["iALS (chosen on validation)"]
  assert 0.0 < ials["top100"]["mean"] <= 1.0
  # Both protocols: with each user's training movies excluded, every row
  # (EASE included) ranks fewer candidates, so it hits at least as often.
  for label, kept in summary["retrieval_hit_rate"].items():
    excluded = summary["retrieval_hit_rate_excluded"][label]
    assert excluded["top100"]["mean"] >= kept["top100"]["mean"] - 0.02, label
  assert "EASE (chosen on validation)" in summary["retrieval_hit_rate"]
  assert "seen items excluded" in printed
  assert "movielens_fm.gin" in printed


def test_unknown_gin_parameter_names_the_file(tmp_path, capsys):
  bad = tmp_path / "bad.gin"
  bad.write_text("include 'base.gin'\ntrain.global_batch = 64\n")
  code = cli.main(
    ["train", "--gin_file", str(bad), "--model_dir", str(tmp_path / "m")]
  )
  err = capsys.readouterr().err
  assert code == 2
  assert f"{bad}:2: 'train' has no parameter 'global_batch'" in err
  assert "did you mean 'global_batch_size'?" in err


def test_missing_required_macro_names_the_file_that_declares_it(
  tmp_path, capsys
):
  code = cli.main(
    [
      "train",
      "--gin_file",
      os.path.join(config.EXPERIMENTS_DIR, "criteo_dlrm.gin"),
      "--model_dir",
      str(tmp_path),
    ]
  )
  err = capsys.readouterr().err
  assert code == 2
  assert "CRITEO_DIR" in err and "criteo_kaggle.gin:" in err
  assert "--gin_bindings" in err


def test_missing_required_train_argument_names_the_files(tmp_path, capsys):
  only_base = os.path.join(config.EXPERIMENTS_DIR, "base.gin")
  code = cli.main(
    ["train", "--gin_file", only_base, "--model_dir", str(tmp_path)]
  )
  err = capsys.readouterr().err
  assert code == 2
  assert "train" in err and "data" in err and "base.gin" in err


def test_info_prints_strategy_and_backend_choice(capsys):
  assert cli.main(["info"]) == 0
  out = capsys.readouterr().out
  assert "embedding backend: auto -> tensorcore" in out and "TensorFlow" in out
  assert "fused CPU kernels (tensorcore on CPU): " in out


def test_info_plans_the_experiment_tables_with_its_optimizer(capsys):
  assert (
    cli.main(
      [
        "info",
        "--gin_file",
        "experiments/synthetic_dlrm.gin",
        "--gin_bindings",
        "EmbeddingSettings.dim = 8",
        "--gin_bindings",
        "train.embedding_optimizer = @embedding.FTRL()",
      ]
    )
    == 0
  )
  out = capsys.readouterr().out
  # C4: 10000 x 8 floats = 312.5 KiB, FTRL keeps two slots of the same size.
  assert (
    "C4     10000  8    float32  FTRL       2      312.5 KiB  625.0 KiB  "
    "937.5 KiB" in out
  )


def test_info_plans_row_sharding_for_the_runs_replicas_and_budget(capsys):
  """The run's replicas (train.num_cpu_replicas) and a device's memory: the
  largest table is row-sharded, the rest fit replicated."""
  bindings = [
    "train.num_cpu_replicas = 2",
    "train.placement = @EmbeddingPlacement()",
    # Adam tables: 4.0 MiB replicated; C4 (1.8 MiB) halved fits 3.2 MiB.
    "EmbeddingPlacement.device_memory = '4MiB'",
  ]
  flags = sum((["--gin_bindings", b] for b in bindings), [])
  gin_file = "experiments/synthetic_dlrm.gin"
  assert cli.main(["info", "--gin_file", gin_file, *flags]) == 0
  out = capsys.readouterr().out
  assert re.search(r"^  C4 .* 937\.5 KiB +row_sharded /2 ", out, re.M), out
  assert re.search(r"^  C3 .* 937\.5 KiB +replicated ", out, re.M), out
  assert "of 4.0 MiB (EmbeddingPlacement.device_memory)" in out


def _padded(ids, width):
  """Ragged/dense ids -> the export's `[B, W]` padded with -1 (or `[B]`)."""
  if isinstance(ids, tf.RaggedTensor):
    return ids.to_tensor(default_value=-1, shape=[None, width]).numpy()
  return ids.numpy()


# ~40 s: a recsys process trains on 2 replicas (TF not yet started, as a
# user runs it), evaluate and export run in-process, a fresh process serves
# before it imports the project
@pytest.mark.slow
def test_train_evaluate_export_and_serve_in_a_fresh_process(
  tmp_path, tmp_path_factory, caplog, two_step_run
):
  """The README's cpu_2replicas.gin from a fresh process, run as a user
  would (TF's own log level, output to a pipe), on an eval split smaller
  than one eval batch: all 50 examples scored. Then evaluate and export the
  run, and serve the export in a fresh process before it imports anything
  of the project (`_fresh_interpreter`, which then runs the next test's
  commands)."""
  model_dir, export_dir = tmp_path / "run", tmp_path / "export"
  bindings = sum(
    (
      ["--gin_bindings", b]
      for b in TINY
      + ["SyntheticCTR.num_eval_examples = 50", "train.eval_steps = None"]
    ),
    [],
  )
  # TF's defaults: its log level, oneDNN (whose start-up line is noise) and
  # grappler.
  env = without_child_site(
    {
      k: v
      for k, v in os.environ.items()
      if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
    }
  )
  done = run_recsys(
    "train",
    "--gin_file",
    DEFAULT,
    "--gin_file",
    "experiments/hardware/cpu_2replicas.gin",
    *bindings,
    "--model_dir",
    str(model_dir),
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  # Not a terminal: log lines, no progress-bar frames; TF's start-up noise
  # is gone and the devices are said once.
  assert "\r" not in done.stderr and "step 6/6 loss" in done.stderr
  assert (
    "oneDNN custom operations" not in done.stderr
    and "cuInit" not in done.stderr
  )
  assert done.stderr.count("devices: ") == 1
  metrics = json.loads((model_dir / "metrics.json").read_text())
  assert metrics["replicas"] == 2 and metrics["step"] == 6
  assert metrics["eval/examples"] == 50
  assert 0.0 < metrics["eval/auc"] < 1.0

  # Evaluation reads the run's operative config: 2 replicas again.
  assert cli.main(["evaluate", "--model_dir", str(model_dir)]) == 0
  gin.clear_config()
  evaluated = json.loads((model_dir / "eval_metrics.json").read_text())
  assert evaluated["eval/examples"] == 50
  np.testing.assert_allclose(
    evaluated["eval/auc"], metrics["eval/auc"], rtol=1e-6
  )

  caplog.clear()
  with caplog.at_level("INFO"):
    assert (
      cli.main(
        [
          "export",
          "--model_dir",
          str(model_dir),
          "--export_dir",
          str(export_dir),
        ]
      )
      == 0
    )
  gin.clear_config()
  # Synthetic data has no raw form: the export says it has only id signatures.
  assert "no raw-feature signature: SyntheticCTR has no raw form" in caplog.text
  assert "exported signatures: serving_default\n" in caplog.text + "\n"

  # Reference predictions in this process, from the checkpoint, through the
  # tensorcore backend's lookups (not the export's serving lookups).
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  config.parse(
    [str(model_dir / "operative_config.gin")],
    # The 2-replica checkpoint, read on one replica.
    [
      "train.progress_bar = False",
      "train.summaries = False",
      "train.num_cpu_replicas = 1",
    ],
  )
  trainer = train(model_dir=str(model_dir), action="build")
  assert trainer.run.restored_step == 6
  features, _ = next(iter(trainer.run.source.dataset(13, training=False)))
  names = list(trainer.run.feature_config)
  acts = trainer.backend.lookup({n: features["categorical"][n] for n in names})
  want = trainer.model(acts, features).numpy()

  specs = {s.name: s for s in trainer.run.source.feature_specs}
  inputs = {"dense": features["dense"].numpy()}
  for n in names:
    inputs[n] = _padded(features["categorical"][n], specs[n].max_ids)
  np.savez(tmp_path / "inputs.npz", **inputs)
  child = _fresh_interpreter(
    two_step_run,
    tmp_path_factory,
    serve=(str(export_dir), str(tmp_path / "inputs.npz")),
  )
  got = np.load(child["scores"])
  assert got.shape == (13,)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
  """The default experiment trained 2 tiny steps (`recsys.cli.main`), once
  for the module: tests evaluate or export a copy (`_copy_of`)."""
  model_dir = str(tmp_path_factory.mktemp("two_steps") / "run")
  bindings = sum(
    (["--gin_bindings", b] for b in TINY + ["train.train_steps = 2"]), []
  )
  train = ["train", "--gin_file", DEFAULT, *bindings, "--model_dir", model_dir]
  gin.clear_config()
  assert cli.main([*train, "--no_progress"]) == 0
  gin.clear_config()
  return model_dir


def _copy_of(run, tmp_path):
  """A copy of a trained run's folder (file times kept) in tmp_path/run."""
  model_dir = str(tmp_path / "run")
  shutil.copytree(run, model_dir)
  return model_dir


#: The fresh interpreter's results, once per module (`_fresh_interpreter`).
_FRESH: dict = {}

#: A fresh interpreter, as a user's: first (when asked) it serves an export
#: with TensorFlow alone, nothing of the project imported, then it runs
#: `recsys evaluate` and `recsys export` of a trained run and prints the
#: modules of `recsys.training` they loaded.
_FRESH_CHILD = textwrap.dedent("""
    import json, sys
    serve, model_dir, export_dir = json.loads(sys.argv[1])
    if serve:
      import numpy as np, tensorflow as tf
      assert not [m for m in sys.modules if m.split(".")[0] in
                  ("recsys", "backends")], "the project was imported"
      export, inputs, scores = serve
      served = tf.saved_model.load(export).signatures["serving_default"]
      inputs = dict(np.load(inputs))
      got = served(**{k: tf.constant(v) for k, v in inputs.items()})
      np.save(scores, got["scores"].numpy())
    import gin
    from recsys import cli
    assert cli.main(["evaluate", "--model_dir", model_dir]) == 0
    gin.clear_config()
    assert cli.main(["export", "--model_dir", model_dir,
                     "--export_dir", export_dir]) == 0
    print(sorted(m for m in sys.modules
                 if m == "recsys.training" or m.startswith("recsys.training.")))
""")


def _fresh_interpreter(run, tmp_path_factory, serve=None):
  """Runs `_FRESH_CHILD` once for the module (again only if a caller asks
  it to serve and the first run did not): evaluate and export a copy of
  `run`; `serve`: (export dir, inputs .npz) to score first. One TensorFlow
  process for both tests that need a fresh one."""
  if not _FRESH or (serve and not _FRESH["scores"]):
    folder = tmp_path_factory.mktemp("fresh_interpreter")
    model_dir = _copy_of(run, folder)
    scores = str(folder / "scores.npy") if serve else None
    export_dir = str(folder / "export")
    argv = [
      [*serve, scores] if serve else None,
      model_dir,
      export_dir,
    ]
    done = subprocess.run(
      [sys.executable, "-c", _FRESH_CHILD, json.dumps(argv)],
      cwd=ROOT,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
      capture_output=True,
      text=True,
      timeout=300,
    )
    _FRESH.update(
      done=done, model_dir=model_dir, export_dir=export_dir, scores=scores
    )
  assert _FRESH["done"].returncode == 0, _FRESH["done"].stderr[-3000:]
  return _FRESH


def test_evaluate_and_export_load_no_training_module(
  tmp_path_factory, two_step_run
):
  """`recsys evaluate` and `recsys export` of a trained run, in a fresh
  interpreter as a user runs them (`_fresh_interpreter`): both succeed, and
  no module of `recsys.training` (the loop, the Trainer) was ever loaded."""
  child = _fresh_interpreter(two_step_run, tmp_path_factory)
  done = child["done"]
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
  assert os.path.exists(os.path.join(child["export_dir"], "saved_model.pb"))
  metrics = os.path.join(child["model_dir"], "eval_metrics.json")
  with open(metrics, encoding="utf-8") as f:
    assert json.load(f)["step"] == 2


# ~10 s: trains, exports and loads a two-tower model in-process
@pytest.mark.slow
def test_export_of_a_retrieval_model_serves_the_models_top_k(tmp_path):
  """Two-tower: exported tower signatures and top-k equal the trained model."""
  model_dir, export_dir = str(tmp_path / "run"), str(tmp_path / "export")
  tiny = [
    "SyntheticRetrieval.num_users = 50",
    "SyntheticRetrieval.num_items = 37",
    "EmbeddingSettings.dim = 7",
    "TwoTower.query_tower = (11,)",
    "TwoTower.candidate_tower = (11,)",
    *train_bindings(
      global_batch_size=32,
      train_steps=4,
      steps_per_loop=2,
      eval_steps=1,
      summaries=False,
    ),
  ]
  two_tower = os.path.join(config.EXPERIMENTS_DIR, "synthetic_two_tower.gin")
  train_and_export(two_tower, tiny, model_dir, export_dir)

  # Reference: the checkpoint through the training backend's lookups.
  from recsys.serving.lookup import split_batch  # pylint: disable=g-import-not-at-top
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  config.parse(
    [os.path.join(model_dir, "operative_config.gin")],
    ["train.progress_bar = False"],
  )
  trainer = train(model_dir=model_dir, action="build")
  trainer.run.index_corpus()
  model, names = trainer.model, list(trainer.run.feature_config)
  features, _ = next(iter(trainer.run.source.dataset(13, training=False)))
  acts = trainer.backend.lookup(*split_batch((features, None), names))
  want_q = model.query_embeddings(acts, features).numpy()
  want_c = model.candidate_embeddings(acts, features).numpy()
  corpus_ids, corpus = (t.numpy() for t in model.corpus_index.corpus())
  want_scores = np.sort(want_q @ corpus.T, axis=1)[:, ::-1]

  specs = {s.name: s for s in trainer.run.source.feature_specs}
  inputs = {
    n: tf.constant(_padded(features["categorical"][n], specs[n].max_ids))
    for n in names
  }
  loaded = tf.saved_model.load(export_dir)
  query = {n: inputs[n] for n in model.query_features}
  got_q = loaded.signatures["query_embeddings"](**query)["embeddings"].numpy()
  got_c = loaded.signatures["candidate_embeddings"](
    **{n: inputs[n] for n in model.candidate_features}
  )["embeddings"].numpy()
  top = loaded.signatures["serving_default"](**query)
  np.testing.assert_allclose(got_q, want_q, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_c, want_c, rtol=1e-5, atol=1e-6)
  assert top["scores"].shape == (13, 37)
  np.testing.assert_allclose(
    top["scores"].numpy(), want_scores, rtol=1e-5, atol=1e-6
  )
  best = corpus_ids[np.argmax(want_q @ corpus.T, axis=1)]
  np.testing.assert_array_equal(top["candidate_ids"].numpy()[:, 0], best)


@pytest.mark.parametrize(
  "given, cores, expected",
  [
    ((0, 0), 2, (1, 2)),  # small machine, nothing given: 1 / 2
    ((0, 0), 1, (1, 2)),
    ((0, 0), 8, (0, 0)),  # larger machine: TF's defaults
    ((2, 0), 2, (2, 0)),  # a flag given: kept as given
    ((0, 3), 2, (0, 3)),
  ],
)
def test_thread_settings(given, cores, expected):
  intra, inter, why = threads.thread_settings(*given, cores)
  assert (intra, inter) == expected
  assert bool(why) == (expected == (1, 2) and given == (0, 0))


def test_experiments_lists_and_prints_the_shipped_gin_files(capsys):
  assert cli.main(["experiments"]) == 0
  out = capsys.readouterr().out
  for name in (
    "synthetic_dlrm.gin",
    "hardware/cpu_2replicas.gin",
    "data/criteo_kaggle.gin",
  ):
    assert f"  {name} " in out
  assert cli.main(["experiments", "hardware/cpu_2replicas.gin"]) == 0
  with open(
    os.path.join(config.EXPERIMENTS_DIR, "hardware", "cpu_2replicas.gin"),
    encoding="utf-8",
  ) as f:
    assert capsys.readouterr().out == f.read()
  assert cli.main(["experiments", "nope.gin"]) == 2
  assert "synthetic_dlrm.gin" in capsys.readouterr().err  # the valid names


def test_includes_resolve_next_to_the_including_file_then_shipped(
  tmp_path, monkeypatch
):
  """A user's gin tree outside the repo: a nested include is found next to
  the file that includes it, a shipped experiment by its name."""
  (tmp_path / "cfg" / "sub").mkdir(parents=True)
  (tmp_path / "cfg" / "my.gin").write_text(
    "include 'synthetic_dlrm.gin'\ninclude 'sub/tiny.gin'\n"
  )
  (tmp_path / "cfg" / "sub" / "tiny.gin").write_text("include 'steps.gin'\n")
  (tmp_path / "cfg" / "sub" / "steps.gin").write_text("train.train_steps = 7\n")
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")
  config.parse(["../cfg/my.gin"])
  assert gin.query_parameter("train.train_steps") == 7
  assert gin.query_parameter("DLRM.bottom_mlp") == (
    64,
    16,
  )  # shipped, with base.gin
  gin.clear_config()
  config.parse(["synthetic_dlrm.gin"])  # a shipped experiment by name
  assert gin.query_parameter("train.steps_per_loop") == 200


@pytest.mark.slow  # evaluates a copy of the module's 2-step run in-process
def test_evaluate_only_reads_the_model_dir(tmp_path, capsys, two_step_run):
  """No event files, no config rewritten: only eval_metrics.json is added."""
  model_dir = _copy_of(two_step_run, tmp_path)

  def files():
    return {
      os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
      for d, _, names in os.walk(model_dir)
      for f in names
    }

  before = files()
  capsys.readouterr()
  assert cli.main(["evaluate", "--model_dir", model_dir]) == 0
  captured = capsys.readouterr()
  printed = json.loads(captured.out)
  assert printed["step"] == 2 and printed["eval/examples"] == 2 * 64
  kept = os.path.join(model_dir, "eval_metrics.json")
  assert captured.err.splitlines()[-1] == (  # issue 52: one line at the end
    f"recsys evaluate: AUC {printed['eval/auc']:.4f} at step 2 on 128 "
    f"examples; kept in {kept}."
  )
  after = files()
  assert set(after) - set(before) == {
    os.path.join(model_dir, "eval_metrics.json")
  }
  assert all(after[p] == t for p, t in before.items())


def test_tf_startup_noise_is_dropped_and_the_rest_kept():
  from recsys import _tf_startup  # pylint: disable=g-import-not-at-top

  lines = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n",
    "I0000 00:00:1.1 1 port.cc:153] oneDNN custom operations are on. "
    "You may see\n",
    "E0000 00:00:1.2 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL\n",
    "E0000 00:00:1.3 1 util.cc:131] oneDNN supports DT_INT64 only on "
    "platforms with AVX-512. Falling back to the default Eigen-based "
    "implementation if present.\n",
    "E0000 00:00:1.3 1 something.cc:1] a real error\n",
  ]
  assert _tf_startup.keep(lines) == lines[4:]


def test_train_refuses_a_memory_plan_beyond_the_host(tmp_path, capsys):
  """Criteo at MLPerf vocabularies, uncapped: ~100 GiB of tables, refused
  before any is allocated, naming the largest; cpu_small.gin is the way out."""
  (tmp_path / "train.txt").write_text(
    "1\t" + "\t".join(["1"] * 13 + ["a"] * 26) + "\n"
  )
  bindings = [
    f"CRITEO_DIR = '{tmp_path}'",
    "CriteoTSV.vocab_sizes = 'mlperf'",
    "CriteoTSV.max_vocab_size = None",
  ]
  code = cli.main(train_argv("criteo_dlrm.gin", tmp_path / "run", bindings))
  err = capsys.readouterr().err
  assert code == 1
  assert (
    "MemoryPlanError" in err
    and "C1 (39884406 x 128, 0 slot(s): 19.0 GiB)" in err
  )
  assert "cpu_small.gin" in err and "--skip_memory_check" in err
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_each_command_in_a_process_starts_from_its_own_gin_files(capsys):
  """A notebook or a test calls `cli.main` again: nothing carries over."""
  bad = ["--gin_bindings", "train.placement = 3"]
  assert cli.main(["info", "--gin_file", DEFAULT, *bad]) == 2
  assert "train.placement is 3" in capsys.readouterr().err
  assert cli.main(["info", "--gin_file", DEFAULT]) == 0
  gin.parse_config("train.train_steps = 7", skip_unknown=True)
  gin.finalize()  # a locked config, as `recsys train` leaves it
  assert cli.main(["info", "--gin_file", DEFAULT]) == 0


def test_import_recsys_quiets_tensorflow_unless_the_user_set_its_level(
  monkeypatch,
):
  """The package's import path (tests/test_keras_guard.py runs it on the
  real TensorFlow): the user's own TF_CPP_MIN_LOG_LEVEL is theirs."""
  from recsys import _tf_startup  # pylint: disable=g-import-not-at-top

  def hooked():
    return any(
      type(f).__name__ == "_QuietTensorFlowImport" for f in sys.meta_path
    )

  monkeypatch.delitem(sys.modules, "tensorflow")  # as before TF's import
  monkeypatch.setattr(_tf_startup, "_USER_LOG_LEVEL", "0")
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
  _tf_startup.quiet_tensorflow_import()
  _tf_startup.set_log_level("2")  # what a command asks, not taken
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0" and not hooked()

  monkeypatch.setattr(_tf_startup, "_USER_LOG_LEVEL", None)
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
  try:
    _tf_startup.quiet_tensorflow_import()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1" and hooked()
    _tf_startup.set_log_level(None)  # --verbose: TF's default
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
  finally:
    _tf_startup.uninstall_quiet_import()
  assert not hooked()
