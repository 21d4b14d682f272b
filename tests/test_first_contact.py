"""What a new user meets walking the README from a fresh clone (issue 44).

Each case is something a first run met: a second `make demo` that trained
nothing, said nothing and replaced metrics.json; a demo ending in a JSON
whose `bayes_auc` nothing explained; 6-10 s of TensorFlow start-up before a
misspelt --gin_file was reported; `C1: replicated: replicated: one replica`
once per table on every command; Ctrl-C exiting 143; no `--version`; a
missing data folder's path tacked onto the end of its message.
"""

import contextlib
import io
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import gin
import pytest

from recsys import cli, cli_checks
from recsys.model_dir import run_dir
from recsys.process import console
from tests.cli_runs import DEFAULT, ROOT, flags, tiny

TINY = tiny(train_steps=2, eval_steps=2)


def _recsys(*args, brief=None):
  """`recsys ARGS` in this process: (exit status, stdout, stderr with the
  log lines of recsys's loggers). `brief`: a stream that gets what the
  command's default console shows of them (`recsys.process.console`)."""
  out, err = io.StringIO(), io.StringIO()
  handlers = [logging.StreamHandler(err)]
  if brief is not None:
    handlers.append(console.handler(args[0], "brief", brief))
  logger = logging.getLogger("recsys")
  level = logger.level
  for handler in handlers:
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)  # as the command's own logging set-up does
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      code = cli.main(list(args))
  finally:
    for handler in handlers:
      logger.removeHandler(handler)
    logger.setLevel(level)
    gin.clear_config()
  return code, out.getvalue(), err.getvalue()


def _fresh_process(*args, cwd=ROOT):
  """`python -X importtime -m recsys ARGS`: its status, stdout, stderr and
  whether it imported TensorFlow (importtime lists every module)."""
  done = subprocess.run(
    [sys.executable, "-X", "importtime", "-m", "recsys", *args],
    cwd=cwd,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  imported_tf = bool(re.search(r"\|\s+tensorflow$", done.stderr, re.M))
  messages = "\n".join(
    line
    for line in done.stderr.splitlines()
    if not line.startswith("import time:")
  )
  return done.returncode, done.stdout, messages, imported_tf


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  """A tiny `make demo`, run twice on one model dir: each run's (status,
  stdout, stderr), and metrics.json after the first and the second."""
  model_dir = tmp_path_factory.mktemp("first_contact") / "demo"
  args = ["train", "--gin_file", DEFAULT, "--model_dir", str(model_dir)]
  args += flags(TINY)
  brief = io.StringIO()
  first = _recsys(*args, brief=brief)
  metrics = model_dir / "metrics.json"
  after_first = json.loads(metrics.read_text())
  second = _recsys(*args)
  return {
    "model_dir": model_dir,
    "first": first,
    "second": second,
    "after_first": after_first,
    "brief": brief.getvalue(),
    "after_second": json.loads(metrics.read_text()),
  }


def test_train_ends_with_the_auc_next_to_the_best_possible(demo):
  code, out, err = demo["first"]
  assert code == 0, err[-3000:]
  metrics = json.loads(out)  # stdout stays one JSON document
  last = err.strip().splitlines()[-1]
  assert last == (
    f"recsys train: AUC {metrics['eval/auc']:.4f} at step 2; the best "
    f"possible on this data: {metrics['bayes_auc']:.4f}. Run folder: "
    f"{demo['model_dir']} (metrics.json, checkpoints, TensorBoard "
    "summaries)."
  )


def test_a_plain_train_shows_what_matters(demo):
  """Issue 52: a plain `recsys train` printed 78 lines of which ~4
  mattered. By default: the devices, the backend and its plan, progress,
  what runs after the last step; the rest is at --verbosity info."""
  _, _, err = demo["first"]
  shown = demo["brief"].splitlines()
  assert shown[0].startswith("devices: ")
  assert shown[1].startswith("embedding backend tensorcore (auto: ")
  assert (
    shown[2].split()
    == (
      "table vocab dim dtype optimizer slots table slots per device "
      "placement exchange/step"
    ).split()
  )
  assert shown[-2].startswith("step 2/2 loss ")
  assert shown[-1] == "step 2: the final checkpoint and evaluation ..."
  assert len(shown) == 3 + 8 + 2 + 2  # 8 tables, total and peak RSS
  assert not re.search(r"\d\d:\d\d:\d\d|INFO|recsys\.", demo["brief"])
  for line in ("saved checkpoint", "trained 2 steps in", "peak RSS of this"):
    assert line not in demo["brief"] and line in err


def test_a_finished_run_run_again_says_so_and_keeps_its_metrics(demo):
  code, out, err = demo["second"]
  assert code == 0, err[-3000:]
  assert "nothing to train" in err  # the Trainer's warning, as it starts
  last = err.strip().splitlines()[-1]
  assert f"nothing trained: {demo['model_dir']} was complete already" in last
  assert "another --model_dir" in last and "train.train_steps = 4" in last
  assert "The restored model: AUC " in last
  printed = json.loads(out)
  assert printed["steps_trained"] == 0 and printed["step"] == 2
  assert "train/loss" not in printed
  # The first run's figures stay: its training loss and speed.
  first = demo["after_first"]
  assert demo["after_second"] == first
  assert first["steps_trained"] == 2
  assert "train/loss" in first and "examples_per_second_whole_run" in first
  assert first["learning_rate"] > 0  # the dense optimizer's: DLRM has one


def test_a_retrieval_run_ends_with_its_hit_rate_next_to_the_best():
  from recsys.run import run_summaries  # pylint: disable=g-import-not-at-top

  metrics = {"step": 300, "eval/hit_rate_top1": 0.01, "best_hit_rate_1": 0.1}
  metrics.update({"eval/hit_rate_top10": 0.25, "best_hit_rate_10": 0.5})
  assert run_summaries.against_optimum(metrics) == (
    "top-10 hit rate 0.2500 at step 300; the best possible on this data: 0.5000"
  )
  assert run_summaries.against_optimum({"eval/rmse": 0.9, "step": 1}) == ""


def test_the_plan_is_printed_once_with_reasons_only_where_they_say_something(
  demo,
):
  _, _, err = demo["first"]
  assert "embedding backend tensorcore (auto: " in err
  assert "replicated: replicated" not in err
  assert not re.search(r"^C\d+: ", err, re.M), err  # no line per table
  assert len(re.findall(r"^C1 ", err, re.M)) == 1  # its row of the table
  # A forced and a row-sharded table say why; the other tables nothing.
  bindings = [
    "train.num_cpu_replicas = 2",
    "train.placement = @EmbeddingPlacement()",
    "EmbeddingPlacement.device_memory = '4MiB'",
    "EmbeddingPlacement.tables = {'C1': 'row_sharded'}",
  ]
  code, out, err = _recsys("info", "--gin_file", DEFAULT, *flags(bindings))
  assert code == 0, err
  reasons = re.findall(r"^  (C\d+(?:, C\d+)*): (.*)$", out, re.M)
  assert [tables for tables, _ in reasons] == ["C1", "C4"], out
  assert "forced" in reasons[0][1] and "over the budget" in reasons[1][1]


def test_export_predicts_no_training_process(demo):
  export_dir = demo["model_dir"].parent / "export"
  code, out, err = _recsys(
    "export",
    "--model_dir",
    str(demo["model_dir"]),
    "--export_dir",
    str(export_dir),
  )
  assert code == 0, err[-3000:]
  assert out.splitlines()[-1] == (
    f"recsys export: exported step 2 of {demo['model_dir']} to {export_dir}."
  )
  # The serving backend's plan is no training memory table: not shown.
  assert "its tables:" not in err and "per device" not in err
  assert "predicted peak RSS" not in err


def test_another_models_checkpoint_is_refused_naming_the_settings(
  demo, tmp_path
):
  """Issue 52: DCN-v2 trained into DLRM's model dir listed 55 variables, not
  the settings that made them differ."""
  model_dir = tmp_path / "demo"
  shutil.copytree(demo["model_dir"], model_dir)
  args = ["train", "--gin_file", DEFAULT.replace("dlrm", "dcn")]
  code, _, err = _recsys(*args, *flags(TINY), "--model_dir", str(model_dir))
  assert code == 1, err[-3000:]
  error = err[err.index("recsys train: ") :].splitlines()
  assert error[:2] == [
    "recsys train: ChangedSettingsError: the checkpoint in "
    f"{model_dir} was trained with other settings:",
    "  train.model: @DLRM -> @DCNv2",
  ]
  assert re.match(
    r"so \d+ of its variables do not fit this model \(e\.g\. ", error[2]
  )
  assert "another --model_dir" in error[2] and len(error) == 4


@pytest.mark.parametrize(
  "args,status,says",
  [
    (
      ["train", "--gin_file", "experiments/synthetic_dlrmm.gin"],
      2,
      "gin file 'experiments/synthetic_dlrmm.gin' does not exist",
    ),
    (["evaluate", "--model_dir", "runs/no_such_run"], 1, "does not exist"),
    (["export", "--export_dir", "x", "--model_dir", "."], 1, "pass --gin_file"),
    (  # issue 52: a misspelt gin parameter, at once, in two lines
      [
        "train",
        "--gin_file",
        DEFAULT,
        "--gin_bindings",
        "train.train_stepz = 5",
      ],
      2,
      "'train' has no parameter 'train_stepz'; did you mean 'train_steps'?",
    ),
    (  # issue 52: --k of a ranking model's export (it took 11 s)
      ["export", "--export_dir", "x", "--model_dir", "run", "--k", "5"],
      2,
      "k=5 applies to retrieval models (their top-k signatures); DLRM is a "
      "ranking model",
    ),
  ],
)
def test_a_wrong_path_is_reported_before_tensorflow_is_imported(
  args, status, says, tmp_path
):
  if args[0] == "train":
    args = args + ["--model_dir", str(tmp_path / "run")]
  else:  # a run folder of a ranking model: its config only
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "operative_config.gin").write_text(
      "train.model = @DLRM\n"
    )
  code, _, err, imported_tf = _fresh_process(*args, cwd=tmp_path)
  assert code == status, err
  assert says in err
  assert not imported_tf


def test_version_prints_the_versions_without_tensorflow():
  code, out, err, imported_tf = _fresh_process("--version")
  assert code == 0, err
  assert re.fullmatch(
    r"recsys \S+, TensorFlow 2\.\S+, Keras 2\.\S+ \(tf_keras\), "
    r"Python 3\.\S+\n",
    out,
  ), out
  assert not imported_tf


def test_the_pre_tensorflow_check_reads_the_runs_own_config_file():
  assert cli_checks.OPERATIVE_CONFIG_FILE == run_dir.OPERATIVE_CONFIG_FILE


def test_ctrl_c_outside_the_training_loop_exits_130_in_one_line(
  monkeypatch, capsys
):
  def interrupted(args):
    raise KeyboardInterrupt

  monkeypatch.setattr(cli.COMMANDS["train"], "run", interrupted)
  code = cli.main(["train", "--gin_file", DEFAULT, "--model_dir", "/tmp/r"])
  err = capsys.readouterr().err
  assert code == 130
  assert err == (
    "recsys train: interrupted (Ctrl-C); checkpoints already saved are kept.\n"
  )


@pytest.mark.slow  # a fresh TensorFlow process trains until interrupted
def test_ctrl_c_in_the_training_loop_saves_and_exits_130(tmp_path):
  bindings = [
    "train.global_batch_size = 64",
    "train.train_steps = 1000000",
    "train.steps_per_loop = 5",
    "train.eval_steps = 1",
    "SyntheticCTR.oracle_examples = 1024",
  ]
  model_dir = tmp_path / "run"
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "recsys",
      "train",
      "--gin_file",
      DEFAULT,
      "--model_dir",
      str(model_dir),
      "--no_progress",
      "--verbosity",
      "info",  # every loop's line, not a tenth of the run's
      *flags(bindings),
    ],
    cwd=ROOT,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1"),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  lines: queue.Queue = queue.Queue()
  threading.Thread(
    target=lambda: [lines.put(line) for line in proc.stderr], daemon=True
  ).start()
  seen, deadline = [], time.time() + 240
  try:
    while time.time() < deadline:
      line = lines.get(timeout=max(0.1, deadline - time.time()))
      seen.append(line)
      if re.search(r"step \d+/1000000 loss", line):  # in the loop
        proc.send_signal(signal.SIGINT)
        break
    assert proc.wait(timeout=240) == 130, "".join(seen)
  finally:
    if proc.poll() is None:
      proc.kill()
  time.sleep(0.2)  # the reader thread drains the rest
  while not lines.empty():
    seen.append(lines.get())
  err = "".join(seen)
  assert "SIGINT received: saved checkpoint" in err, err[-3000:]
  assert "Traceback" not in err


@pytest.mark.parametrize(
  "gin_file,macro,folder",
  [
    ("movielens_ranking.gin", "MOVIELENS_DIR", "data/ml-100kk"),
    ("criteo_dlrm.gin", "CRITEO_DIR", "data/criteoo"),
  ],
)
def test_a_missing_data_folder_is_named_where_it_belongs(
  gin_file, macro, folder, tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  code, _, err = _recsys(
    "train",
    "--gin_file",
    gin_file,
    "--gin_bindings",
    f"{macro} = {folder!r}",
    "--model_dir",
    str(tmp_path / "run"),
  )
  assert code == 1, err
  message = err.split("DatasetNotFoundError: ", 1)[1].splitlines()[0]
  assert message.startswith(
    f"{'MovieLens ml-100k' if macro == 'MOVIELENS_DIR' else 'Criteo kaggle'}"
    f"{'' if macro == 'MOVIELENS_DIR' else ' data'}: folder {folder!r} does "
    f"not exist (cwd: {tmp_path}); put "
  ), message
  assert f" in {folder!r}" in message  # where the files go, said once
  assert not message.endswith(f"in {folder!r}.")  # not tacked onto the end
  assert f"does not exist in {folder!r}" not in message
