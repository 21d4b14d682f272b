"""A run's evaluation and export cannot drift from what it trained (issue 28).

One tiny MovieLens run (FM, generated ml-100k-layout files) is trained once
for the module; `recsys evaluate` and `recsys export` are then run on it
through `recsys.cli.main` (a resume over changed data files in a fresh
process, as a user runs it), with settings that change the split (refused,
naming `setting: old -> new`), on other data on purpose (`--eval_on`, its
own results file), allowed explicitly (recorded), and over data files that
changed since training (refused, naming the file). Training checks its
evaluation split before its first step.
"""

import functools
import json
import logging
import os
import shutil

import gin
import pytest

from recsys import cli, config
from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.testing.movielens import write_ml100k_like
from recsys.training import EmptyEvalSetError, Trainer
from tests.cli_runs import run_recsys
from tests.training.sources import ArraySource

FM = os.path.join(config.EXPERIMENTS_DIR, "movielens_fm.gin")
TINY = [  # the FM on user and item ids only: quick to trace
  "MovieLens.features = ['user_id', 'item_id']",
  "MovieLens.history = None",
  "MovieLens.item_history = None",
  "FactorizationMachine.user_features = ['user_id']",
  "train.train_steps = 4",
  "train.steps_per_loop = 2",
  "train.global_batch_size = 16",
  "train.eval_batch_size = 16",
  "train.summaries = False",
  "EmbeddingSettings.dim = 4",
]


def flags(*bindings):
  return sum((["--gin_bindings", b] for b in bindings), [])


def write_data(folder):
  return write_ml100k_like(
    str(folder), num_users=30, num_items=40, num_ratings=400, seed=1
  )


def train_argv(data, model_dir, *bindings):
  """The arguments of `recsys train` of the tiny FM on `data`."""
  return [
    "train",
    "--gin_file",
    FM,
    *flags(*TINY, f"MOVIELENS_DIR = '{data}'", *bindings),
    "--model_dir",
    str(model_dir),
    "--no_progress",
  ]


def train(data, model_dir, *bindings):
  """`recsys train` in this process; its exit code."""
  gin.clear_config()
  code = cli.main(train_argv(data, model_dir, *bindings))
  gin.clear_config()
  return code


def run_in_process(capsys, *argv):
  """`recsys <argv>` in this process: (exit code, stdout, stderr)."""
  gin.clear_config()
  capsys.readouterr()
  code = cli.main([str(a) for a in argv])
  out = capsys.readouterr()
  gin.clear_config()
  return code, out.out, out.err


def export_in_process(capsys, model_dir, export_dir, *argv):
  """`recsys export` of `model_dir` to `export_dir` (and `argv`) in this
  process: (exit code, stdout, stderr)."""
  args = ["--model_dir", model_dir, "--export_dir", export_dir, *argv]
  return run_in_process(capsys, "export", *args)


def evaluate_on(capsys, model_dir, name, *bindings):
  """`recsys evaluate --eval_on <name>` in this process, with `bindings`."""
  return run_in_process(
    capsys,
    "evaluate",
    "--model_dir",
    model_dir,
    "--eval_on",
    name,
    *flags(*bindings),
  )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """`(data folder, model dir)` of a 4-step FM run on split seed 0."""
  root = tmp_path_factory.mktemp("drift")
  data = write_data(root / "ml-100k")
  assert train(data, root / "run") == 0
  return data, root / "run"


def test_evaluate_and_export_on_another_split_are_refused(
  run, tmp_path, capsys
):
  """The issue's case: `MovieLens.seed = 1` draws a test split that overlaps
  the model's training ratings. Refused, nothing written."""
  _, model_dir = run
  code, _, err = run_in_process(
    capsys,
    "evaluate",
    "--model_dir",
    model_dir,
    *flags("MovieLens.seed = 1"),
  )
  assert code == 1, err[-3000:]
  assert "ChangedSettingsError" in err
  assert "  MovieLens.seed: 0 -> 1\n" in err
  assert "--eval_on NAME" in err
  assert "--allow_changed_settings" in err
  assert not (model_dir / "eval_metrics.json").exists()

  export_dir = tmp_path / "export"
  code, _, err = export_in_process(
    capsys, model_dir, export_dir, *flags("MovieLens.seed = 1")
  )
  assert code == 1, err[-3000:]
  assert "  MovieLens.seed: 0 -> 1\n" in err
  assert "exporting it now" in err
  assert not export_dir.exists()


def test_eval_on_other_data_writes_its_own_results(run, capsys):
  """Other data on purpose: its own file, the changes listed; the run's
  eval_metrics.json is not written."""
  _, model_dir = run
  code, out, _ = evaluate_on(capsys, model_dir, "seed1", "MovieLens.seed = 1")
  assert code == 0
  printed = json.loads(out)
  assert printed["eval_on"] == "seed1"
  assert printed["changed_settings"] == ["MovieLens.seed: 0 -> 1"]
  assert printed["step"] == 4 and printed["eval/examples"] > 0
  kept = json.loads((model_dir / "eval_metrics-seed1.json").read_text())
  assert kept["eval/rmse"] == printed["eval/rmse"]
  assert sorted(os.path.basename(p) for p in kept["eval_input_files"]) == [
    "u.data",
    "u.item",
    "u.user",
  ]
  assert not (model_dir / "eval_metrics.json").exists()
  logged = (model_dir / "changed_settings.jsonl").read_text().splitlines()
  entry = json.loads(logged[-1])
  assert entry["command"] == "evaluate" and entry["step"] == 4
  assert entry["output"].endswith("eval_metrics-seed1.json")


def test_eval_on_other_data_may_not_change_the_model(run, capsys):
  _, model_dir = run
  code, _, err = evaluate_on(
    capsys,
    model_dir,
    "other",
    "MovieLens.seed = 1",
    "FactorizationMachine.global_bias = 3.0",
  )
  assert code == 1
  assert "FactorizationMachine.global_bias: 3.53 -> 3.0" in err
  assert "MovieLens.seed" not in err  # the data may change
  assert not (model_dir / "eval_metrics-other.json").exists()
  code, _, err = evaluate_on(capsys, model_dir, "../x")
  assert code == 1 and "--eval_on '../x': use a plain name" in err


def test_allowed_changes_are_recorded_in_the_run_and_the_output(
  run, capsys, tmp_path
):
  _, model_dir = run
  code, out, _ = run_in_process(
    capsys,
    "evaluate",
    "--model_dir",
    model_dir,
    "--allow_changed_settings",
    *flags("MovieLens.test_fraction = 0.3"),
  )
  assert code == 0
  change = "MovieLens.test_fraction: 0.2 -> 0.3"
  assert json.loads(out)["changed_settings"] == [change]
  kept = json.loads((model_dir / "eval_metrics.json").read_text())
  assert kept["changed_settings"] == [change]

  export_dir = tmp_path / "export"
  code, out, _ = export_in_process(
    capsys,
    model_dir,
    export_dir,
    "--allow_changed_settings",
    *flags("MovieLens.test_fraction = 0.3"),
  )
  assert code == 0 and f"changed: {change}" in out
  provenance = json.loads(
    (export_dir / "assets.extra" / "recsys_export.json").read_text()
  )
  assert provenance["step"] == 4
  assert provenance["changed_settings"] == [change]
  assert provenance["model_dir"] == os.path.abspath(model_dir)
  logged = [
    json.loads(line)
    for line in (model_dir / "changed_settings.jsonl").read_text().splitlines()
  ]
  assert [e["command"] for e in logged[-2:]] == ["evaluate", "export"]
  assert all(e["changes"] == [change] for e in logged[-2:])
  assert logged[-1]["output"] == str(export_dir)

  # The run's own settings: exported, nothing recorded as changed.
  log = model_dir / "changed_settings.jsonl"
  before = log.read_text()
  code, out, _ = export_in_process(capsys, model_dir, export_dir)
  assert code == 0 and "changed:" not in out
  provenance = json.loads(
    (export_dir / "assets.extra" / "recsys_export.json").read_text()
  )
  assert provenance["changed_settings"] == []
  assert log.read_text() == before


@pytest.mark.slow  # ~20 s: two short trainings, a refused resume process
def test_data_files_that_changed_since_training_are_refused(tmp_path, capsys):
  """u.data replaced by other ratings after training: resuming, evaluating
  and exporting the run are refused naming the file; a copy of the same
  files elsewhere is the same data."""
  data = write_data(tmp_path / "ml-100k")
  model_dir = tmp_path / "run"
  assert train(data, model_dir, "train.train_steps = 2") == 0
  recorded = json.loads((model_dir / "input_files.json").read_text())
  assert sorted(os.path.basename(p) for p in recorded["files"]) == [
    "u.data",
    "u.item",
    "u.user",
  ]
  # A copy moved elsewhere: the data setting changed, the files did not.
  moved = tmp_path / "moved"
  shutil.copytree(data, moved)
  code, _, err = run_in_process(
    capsys,
    "evaluate",
    "--model_dir",
    model_dir,
    "--gin_file",
    model_dir / "operative_config.gin",
    *flags(f"MOVIELENS_DIR = '{moved}'"),
  )
  assert code == 1 and f"MOVIELENS_DIR: '{data}' -> '{moved}'" in err
  assert "file /" not in err

  u_data = os.path.join(data, "u.data")
  lines = open(u_data, encoding="latin-1").read().splitlines(keepends=True)
  with open(u_data, "w", encoding="latin-1") as f:  # other ratings
    f.writelines(lines[1:] + [lines[0].replace("\t1\t", "\t2\t", 1)])
  for argv in (
    ["evaluate", "--model_dir", model_dir],
    ["export", "--model_dir", model_dir, "--export_dir", tmp_path / "x"],
  ):
    code, _, err = run_in_process(capsys, *argv)
    assert code == 1, argv
    assert f"file {u_data}: " in err and "other data" in err, argv
    assert "u.item" not in err
  assert not (tmp_path / "x").exists()
  # The case, as a user runs it: a resume in a fresh process.
  done = run_recsys(*train_argv(data, model_dir, "train.train_steps = 4"))
  assert done.returncode == 1, done.stderr[-3000:]
  err = done.stderr
  assert f"file {u_data}: " in err and "resuming would change" in err
  assert "ChangedSettingsError" in err and "u.item" not in err
  assert not os.path.exists(model_dir / "checkpoints" / "ckpt-4.index")

  assert (
    train(
      data,
      model_dir,
      "train.train_steps = 4",
      "train.allow_changed_settings = True",
    )
    == 0
  )
  entry = json.loads(
    (model_dir / "changed_settings.jsonl").read_text().splitlines()[-1]
  )
  assert entry["command"] == "train" and entry["step"] == 2
  assert entry["changes"][0].startswith(f"file {u_data}: ")
  # The resumed run recorded the files it read: they are the run's now.
  code, _, _ = run_in_process(capsys, "evaluate", "--model_dir", model_dir)
  assert code == 0


def test_an_empty_test_split_stops_training_before_its_first_step(
  tmp_path, capsys, caplog
):
  data = write_data(tmp_path / "ml-100k")
  model_dir = tmp_path / "run"
  # In this process the step lines are log records (pytest owns the root
  # logger's handlers), not stderr.
  with caplog.at_level(logging.INFO, logger="recsys.training"):
    code, _, err = run_in_process(
      capsys, *train_argv(data, model_dir, "MovieLens.test_fraction = 0.0")
    )
  # A setting (MovieLensConfigError): 2, as every settings error; it was 1.
  assert code == 2, err[-3000:]
  assert "MovieLens.test_fraction = 0.0 keeps every rating" in err
  assert "num_eval_examples" not in err
  assert "step 2/4" not in caplog.text  # no training step ran
  assert not (model_dir / "checkpoints").exists()
  assert not (model_dir / "metrics.json").exists()


def test_criteo_without_evaluation_files_stops_before_training(
  tmp_path, capsys
):
  from tests.data.test_criteo import make_rows, write  # pylint: disable=g-import-not-at-top

  write(tmp_path / "train.txt", make_rows(64))
  model_dir = tmp_path / "run"
  code, _, err = run_in_process(
    capsys,
    "train",
    "--gin_file",
    os.path.join(config.EXPERIMENTS_DIR, "criteo_dcn.gin"),
    *flags(
      f"CRITEO_DIR = '{tmp_path}'",
      "CriteoTSV.vocab_sizes = 23",
      "EmbeddingSettings.dim = 4",
      "DCNv2.deep_mlp = (8,)",
      "DCNv2.projection_dim = 2",
      "train.global_batch_size = 8",
      "train.train_steps = 4",
      "train.steps_per_loop = 2",
      "train.summaries = False",
    ),
    "--model_dir",
    model_dir,
    "--no_progress",
  )
  assert code == 1
  assert "CriteoTSV has no evaluation files" in err
  assert not (model_dir / "checkpoints").exists()


def test_any_sources_empty_evaluation_split_stops_training_first(tmp_path):
  """The generic check (`DataSource.check_eval_split`): a source whose
  evaluation split yields no example fails before the first step."""
  trainer = Trainer(
    str(tmp_path / "run"),
    ArraySource(),
    functools.partial(DLRM, bottom_mlp=(5,), top_mlp=(5,)),
    eval_source=ArraySource(num_examples=0),
    embedding=EmbeddingSettings(dim=5),
    global_batch_size=8,
    train_steps=2,
    progress_bar=False,
    summaries=False,
  )
  with pytest.raises(EmptyEvalSetError, match="split of ArraySource has no"):
    trainer.train()
  assert int(trainer.run.global_step.numpy()) == 0
  assert not (tmp_path / "run" / "checkpoints").exists()
