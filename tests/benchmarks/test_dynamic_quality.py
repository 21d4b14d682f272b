"""`benchmarks/dynamic_quality.py` as a user runs it (a fresh process, no
conftest set-up) on a tiny setting: 1 seed x 2 variants of 30 steps (each
run a fresh TensorFlow process: the mean +- sd arithmetic needs no more). A
tiny run's AUC says nothing about quality, so only the report is checked:
every row is there and its figures are those of the runs' metrics.json
(and of its own --json); and the runs it starts end with it."""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join("benchmarks", "dynamic_quality.py")
SEEDS = (0,)
TABLES = ("C3", "C4", "C6")
COUNTERS = (
  "capacity",
  "rows_in_use",
  "admissions",
  "evictions",
  "refused",
  "default_hits",
)
TINY = (
  "--seeds",
  ",".join(map(str, SEEDS)),
  "--steps",
  "30",
  "--gin_bindings",
  "train.global_batch_size = 256",
  "--gin_bindings",
  "SyntheticCTR.num_eval_examples = 1024",
  "--gin_bindings",
  "train.eval_steps = 1",
  "--gin_bindings",
  "SyntheticCTR.oracle_examples = 1024",
  "--gin_bindings",
  "train.summaries = False",
)


def _env(tmp_path) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  env["TMPDIR"] = str(tmp_path)  # the default model-dir root goes here
  return env


def _tables(out: str) -> dict[str, list[list[str]]]:
  """Each Markdown table of `out` by its header's first three cells: its
  rows' cells."""
  found: dict[str, list[list[str]]] = {}
  rows = None
  for line in out.splitlines():
    if line.startswith("|---"):
      continue
    if not line.startswith("| ") or not line.endswith(" |"):
      rows = None
      continue
    cells = line[2:-2].split(" | ")
    if rows is None:
      rows = found.setdefault(" | ".join(cells[:3]), [])
    else:
      rows.append(cells)
  return found


def _row(rows: list[list[str]], *first: str) -> list[str]:
  """The cells after `first` of the one row starting with them."""
  hits = [r[len(first) :] for r in rows if tuple(r[: len(first)]) == first]
  assert len(hits) == 1, (first, rows)
  return hits[0]


def _pm(values, sign: str = "") -> str:
  """The script's `mean +- sd` (the mean alone for one value)."""
  mean = f"{statistics.fmean(values):{sign}.4f}"
  if len(values) < 2:
    return mean
  return f"{mean} +- {statistics.stdev(values):.4f}"


@pytest.mark.slow
def test_reports_every_row_with_the_figures_of_metrics_json(tmp_path):
  runs, saved = tmp_path / "runs", tmp_path / "out.json"
  result = subprocess.run(
    [
      sys.executable,
      SCRIPT,
      *TINY,
      "--model_dir_root",
      str(runs),
      "--json",
      str(saved),
    ],
    cwd=ROOT,
    env=_env(tmp_path),
    capture_output=True,
    text=True,
    timeout=300,
  )
  out = result.stdout
  assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
  assert re.search(r"^machine before: .+ cpus; load average ", out, re.M), out
  assert re.search(r"^machine after: ", out, re.MULTILINE), out
  metrics = {}
  for variant in ("dynamic", "hashed"):
    for seed in SEEDS:
      with open(runs / f"{variant}_seed{seed}" / "metrics.json") as f:
        metrics[variant, seed] = json.load(f)
      assert metrics[variant, seed]["step"] == 30
  auc = {k: m["eval/auc"] for k, m in metrics.items()}
  found = _tables(out)
  assert len(found) == 4, out
  per_variant = found["variant | seeds | eval AUC"]
  per_seed = found["seed | dynamic AUC | hashed AUC"]
  counters_table = found["seed | table | capacity"]
  collisions = found["seed | table | rows"]
  assert [r[0] for r in per_variant] == ["dynamic", "hashed"], out
  assert [r[0] for r in per_seed] == [*map(str, SEEDS), "mean +- sd"], out
  every = [[str(s), t] for s in SEEDS for t in TABLES]
  assert [r[:2] for r in counters_table] == every, out
  assert [r[:2] for r in collisions] == every, out

  for variant in ("dynamic", "hashed"):
    mine = [metrics[variant, s] for s in SEEDS]
    cells = _row(per_variant, variant, str(len(SEEDS)))
    assert cells[:4] == [
      _pm([m["eval/auc"] for m in mine]),
      _pm([m["eval/logloss"] for m in mine]),
      _pm([m["bayes_auc"] for m in mine]),
      "30",
    ], out
  diffs = [auc["dynamic", s] - auc["hashed", s] for s in SEEDS]
  for seed, diff in zip(SEEDS, diffs):
    assert _row(per_seed, str(seed), f"{auc['dynamic', seed]:.4f}") == [
      f"{auc['hashed', seed]:.4f}",
      f"{diff:+.4f}",
    ], out
  mean = _row(per_seed, "mean +- sd")
  assert mean[2] == _pm(diffs, sign="+"), out
  assert re.search(
    r"^dynamic - hashed: (dynamic is (ahead|behind) by |one seed)", out, re.M
  )

  saved = json.loads(saved.read_text())
  run_of = {(r["variant"], r["seed"]): r for r in saved["runs"]}
  assert len(run_of) == len(saved["runs"]) and set(run_of) == set(metrics)
  for key, run in run_of.items():
    assert run["metrics"] == metrics[key]
  for variant in ("dynamic", "hashed"):
    wall = [run_of[variant, s]["wall_seconds"] for s in SEEDS]
    cells = _row(per_variant, variant, str(len(SEEDS)))
    assert cells[4] == f"{statistics.fmean(wall):.0f}", out
  streams = saved["streams"]
  for seed in SEEDS:
    for table in TABLES:
      counters = metrics["dynamic", seed]
      values = [int(counters[f"vocabulary/{table}/{c}"]) for c in COUNTERS]
      stream = streams[str(seed)][table]
      cells = _row(counters_table, str(seed), table, f"{values[0]:,}")
      index = run_of["dynamic", seed]["index"][table]
      assert cells == [f"{v:,}" for v in values[1:]] + [
        f"{stream['stream_ids']:,}",
        f"{values[2] - stream['stream_ids']:,}",
        f"{index['window_ids_held']:,} of {stream['window_ids_delivered']:,}",
      ], out
      # 30 steps fill no table: every id the regenerated stream delivers
      # was admitted once, none evicted (the count is the trainer's).
      assert values[3] == 0 and values[2] == stream["stream_ids"], out
      # Collisions: the hashed table's from the stream, the dynamic one's
      # from the checkpoint (distinct ids in distinct rows).
      assert index == {
        "ids": values[1],
        "rows": values[0],
        "sharing": 0,
        "consistent": True,
        "window_ids_held": index["window_ids_held"],
      }
      # No eviction: every id the stream delivered holds its row.
      assert index["window_ids_held"] == stream["window_ids_delivered"] > 0
      hashed, ids = stream["stream_sharing"], stream["stream_ids"]
      assert 0 < hashed <= ids and stream["rows"] == values[0]
      cells = _row(collisions, str(seed), table, f"{values[0]:,}", f"{ids:,}")
      last, shared = stream["window_ids"], stream["window_sharing"]
      assert 0 < shared <= last == values[0]  # the window: capacity ids
      assert cells[:3] == [
        f"{hashed:,} ({100 * hashed / ids:.1f} %)",
        f"{last:,}",
        f"{shared:,} ({100 * shared / last:.1f} %)",
      ], out
      assert cells[-1] == f"0 of {values[1]:,} ids in {values[0]:,} rows"


@pytest.mark.slow
def test_sigterm_stops_the_run_in_progress_and_removes_its_folder(tmp_path):
  """The script owns the runs it starts: SIGTERM while one trains ends
  it too, and the default (temporary) model-dir root is deleted."""
  script = subprocess.Popen(
    [sys.executable, SCRIPT, *TINY, "--variants", "hashed", "--seeds", "0"],
    cwd=ROOT,
    env=_env(tmp_path),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 120
    while not _runs_under(tmp_path):
      assert script.poll() is None, script.communicate()
      assert time.monotonic() < deadline, "no run started"
      time.sleep(0.2)
    script.send_signal(signal.SIGTERM)
    _, err = script.communicate(timeout=120)
  finally:
    if script.poll() is None:
      script.kill()
      script.wait()
  assert script.returncode == 143, err[-2000:]
  assert "no run of this script is left running" in err
  assert not _runs_under(tmp_path)
  assert not list(tmp_path.glob("dynamic_quality_*")), list(tmp_path.iterdir())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_run_starts_still_stops_that_run(
  monkeypatch, tmp_path, signum
):
  """SIGTERM or SIGINT delivered inside `Popen`, after the run's process
  started: the script still stops that run (it used to raise there, before
  the run was its to stop, and leave it running)."""
  from benchmarks import dynamic_quality

  # The script's handlers: SIGTERM raises Stopped, SIGINT KeyboardInterrupt.
  handler, raised = {
    signal.SIGTERM: (dynamic_quality._raise_stopped, dynamic_quality.Stopped),
    signal.SIGINT: (signal.default_int_handler, KeyboardInterrupt),
  }[signum]

  started = []
  real_popen = subprocess.Popen

  def popen(command, **kwargs):
    del command, kwargs
    run = real_popen(
      [sys.executable, "-c", "import time; time.sleep(120)"],
      start_new_session=True,
      stdin=subprocess.DEVNULL,
    )
    started.append(run)
    os.kill(os.getpid(), signum)  # handled before Popen returns
    time.sleep(0.2)
    return run

  monkeypatch.setattr(dynamic_quality.subprocess, "Popen", popen)
  previous = signal.signal(signum, handler)
  try:
    with pytest.raises(raised):
      dynamic_quality.train(
        "unused.gin", [], str(tmp_path / "run"), str(tmp_path / "log")
      )
  finally:
    signal.signal(signum, previous)
  assert started and started[0].poll() is not None, "the run outlived it"


def _runs_under(folder) -> list[int]:
  """Pids of `recsys train` processes whose command line names `folder`."""
  pids = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue
    if " train " in cmd and str(folder) in cmd:
      pids.append(int(entry))
  return pids
