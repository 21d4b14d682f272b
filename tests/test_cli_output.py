"""What the `recsys` command prints: errors, exit statuses, lists, one JSON.

Each case is a noise or a wrong status a new user met (issue 31): gin's
"In call to configurable 'train' (<function train at 0x...>)" line in every
error, a misspelt backend exiting 1 where configuration errors exit 2,
summaries cut mid-word, every worker of a cluster printing the final
metrics, TensorFlow's error-level line at the end of a parameter-server run.
"""

import gc
import io
import json
import re
import subprocess
import sys

import pytest

from recsys import cli, experiments_catalog, launch
from recsys.cli import gin_train, results
from recsys.run import run_summaries
from recsys.run import strategy as strategy_lib
from tests.cli_runs import DEFAULT, flags, tiny, train_argv

TINY = flags(tiny(train_steps=2))


def test_a_misspelt_backend_flag_is_a_configuration_error(tmp_path, capsys):
  """In gin: tests/reliability/test_bad_gin.py."""
  code = cli.main(
    [
      "train",
      "--gin_file",
      DEFAULT,
      *TINY,
      "--backend",
      "tensorcor",
      "--model_dir",
      str(tmp_path),
    ]
  )
  err = capsys.readouterr().err
  assert code == 2, err
  assert "unknown embedding backend 'tensorcor'" in err
  assert "did you mean 'tensorcore'?" in err
  assert "In call to configurable" not in err and "0x" not in err


def test_errors_raised_inside_train_lose_gins_call_trail(tmp_path, capsys):
  """A data error from inside the gin call: one clean message, exit 1."""
  missing = f"CRITEO_DIR = {str(tmp_path / 'none')!r}"
  code = cli.main(train_argv("criteo_dlrm.gin", tmp_path / "run", [missing]))
  err = capsys.readouterr().err
  assert code == 1
  assert "DatasetNotFoundError: Criteo kaggle data: folder" in err
  assert "In call to configurable" not in err
  assert not re.search(r"<(function|class) [^>]* at 0x", err)


def test_experiment_summaries_end_on_whole_words(capsys):
  assert cli.main(["experiments"]) == 0
  out = capsys.readouterr().out
  for experiment in experiments_catalog.list_experiments():
    summary = experiment.summary
    assert summary in out
    with open(experiment.path, encoding="utf-8") as f:
      comment = " ".join(
        word
        for line in f
        if line.startswith("#")
        for word in line.lstrip("# ").split()
      )
    if summary.endswith(" ..."):  # cut: between two whole words
      kept = summary[: -len(" ...")]
      assert (comment + " ").startswith(kept + " "), summary
    else:  # the whole first sentence
      assert comment.startswith(summary) and summary.endswith("."), summary
  terabyte = next(
    e for e in experiments_catalog.list_experiments() if "terabyte" in e.name
  )
  assert "day_0 .. day_23" in terabyte.summary  # not a sentence's end


@pytest.mark.parametrize(
  "task, prints",
  [
    (None, True),
    ({"type": "worker", "index": 0}, True),  # no chief: worker 0 reports
    ({"type": "worker", "index": 1}, False),
    ({"type": "chief", "index": 0}, True),
  ],
)
def test_only_the_chief_prints_the_final_metrics(
  monkeypatch, capsys, task, prints
):
  cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
  if task and task["type"] == "chief":
    cluster["chief"] = ["127.0.0.1:3"]
  if task:
    monkeypatch.setenv(
      "TF_CONFIG", json.dumps({"cluster": cluster, "task": task})
    )
  else:
    monkeypatch.delenv("TF_CONFIG", raising=False)
  assert strategy_lib.is_chief_task() == prints
  monkeypatch.setattr(gin_train, "call_train", lambda args: {"eval/auc": 0.75})
  assert (
    cli.train.run(
      cli.build_parser().parse_args(
        ["train", "--gin_file", DEFAULT, "--model_dir", "unused"]
      )
    )
    == 0
  )
  out = capsys.readouterr().out
  assert ('"eval/auc": 0.75' in out) == prints


def test_launch_drops_tensorflows_end_of_cluster_error_line_only():
  noise = (
    "E0000 00:00:1796240584.891326   18861 function_handle_cache.cc:45] "
    "Failed to clear function handle cache: ...\n"
  )
  assert launch.is_shutdown_noise(noise)
  for kept in (
    "E0000 00:00:17.1 12 server.cc:12] Some other failure\n",
    "Failed to clear function handle cache (said by a user's own code)\n",
  ):
    assert not launch.is_shutdown_noise(kept)


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_the_metrics_go_to_stdout_for_programs_and_when_asked(monkeypatch):
  monkeypatch.setattr("sys.stdout", io.StringIO())  # a pipe, a file
  assert results.wants_json("brief")
  monkeypatch.setattr("sys.stdout", _Terminal())
  assert not results.wants_json("brief")
  assert results.wants_json("info") and results.wants_json("debug")


@pytest.mark.parametrize(
  "metrics, line",
  [
    (
      {"eval/rmse": 0.80344, "eval/loss": 0.7, "step": 300},
      "RMSE 0.8034 at step 300",
    ),
    (  # iALS on MovieLens: TFRS's names, the seen items excluded
      {
        "eval/hit_rate/top_10_categorical_accuracy": 0.19073,
        "eval/hit_rate/top_100_categorical_accuracy": 0.56113,
        "eval/hit_rate/top_5_categorical_accuracy": 0.1,
        "eval/exclude_seen": 1.0,
        "step": 110,
      },
      "top-10 / top-100 hit rates 0.1907 / 0.5611 at step 110 (items each "
      "user had in training excluded)",
    ),
    (  # synthetic two-tower: next to the best (its summary was missing)
      {
        "eval/hit_rate/top_10_categorical_accuracy": 0.2343,
        "best_hit_rate_10": 0.4871,
        "step": 20,
      },
      "top-10 hit rate 0.2343 at step 20; the best possible on this data: "
      "0.4871",
    ),
    ({"eval/auc": 0.61, "step": 4}, "AUC 0.6100 at step 4"),
    ({"eval/loss": 1.5}, "eval loss 1.5000"),
  ],
)
def test_every_run_ends_on_its_key_metric(metrics, line):
  assert run_summaries.result_line(metrics) == line


def test_only_the_console_scripts_exit_skips_the_last_collection(capsys):
  """Issue 52: the interpreter's last garbage collection of what TF traced
  took 1.2-3.3 s after a command's last line. The console script's process
  ends with its command and skips it (gc.freeze); a process that goes on
  (this one) keeps collecting everything."""
  frozen = gc.get_freeze_count()
  assert cli.main(["experiments"]) == 0
  assert gc.get_freeze_count() == frozen
  capsys.readouterr()
  code = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
    "sys.argv = ['recsys', 'experiments']\n"
    "from recsys.cli import main\n"
    "sys.exit(main())\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[-1] == "frozen True"
