"""The README's benchmark commands run as a user runs them: each script in a
fresh process (no conftest set-up), on a tiny workload. Only that they run
and report every row is checked; their figures are measurements, not test
results."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _run(*argv: str) -> str:
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  result = subprocess.run(
    [sys.executable, *argv],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  return result.stdout


# One table (the standard workload has 8): each child traces one lookup.
_TINY_STEP = (
  "--features",
  "1",
  "--rows",
  "1000",
  "--batch",
  "256",
  "--steps",
  "3",
  "--warmup",
  "1",
  "--repeats",
  "1",
)


def _torch_python() -> str:
  return os.environ.get("RECSYS_BENCH_TORCH_PYTHON") or sys.executable


def _has_torchrec() -> bool:
  found = subprocess.run(
    [_torch_python(), "-c", "import torch, fbgemm_gpu, torchrec"],
    capture_output=True,
    check=False,
  )
  return found.returncode == 0


def _setting_rows(out: str, impl: str) -> list[tuple[str, bool, float]]:
  """(threads, marked best, M ids/s) of `impl`'s rows in the first table."""
  pattern = (
    rf"^\| {impl} \| 1000 \| 256 \| ([^|]+) \| (\*\*best\*\*)? \| "
    r"[\d.]+ \| \d+ \| ([\d.]+) \| "
  )
  return [
    (threads, bool(best), float(ids))
    for threads, best, ids in re.findall(pattern, out, re.MULTILINE)
  ]


@pytest.mark.slow
def test_embedding_step_compares_a_rival_at_its_best_thread_setting(tmp_path):
  """A TF rival runs at each `--tf_threads` setting; the faster is marked
  best and recsys's ratio is taken against it, not against the slower.
  recsys runs with TF's threads as `recsys train` chooses them here, and
  the machine's state is printed before and after."""
  from recsys.process import threads as threads_lib

  cores = threads_lib.available_cores()
  intra, inter, _ = threads_lib.thread_settings(0, 0, cores)
  path = tmp_path / "out.json"
  out = _run(
    "benchmarks/embedding_step.py",
    "--impls",
    "recsys,tf_fused",
    "--tf_threads",
    "1,2",
    "--json",
    str(path),
    *_TINY_STEP,
  )
  ((threads, best_recsys, _),) = _setting_rows(out, "recsys")
  assert threads.strip() == f"tf {intra or cores}/{inter or cores}", out
  assert best_recsys, out
  assert re.search(r"^machine before: .+; load average [\d.]+ ", out, re.M)
  assert re.search(r"^machine after: .+; load average [\d.]+ ", out, re.M)
  rows = _setting_rows(out, "tf_fused")
  assert [t.split("/")[0] for t, _, _ in rows] == ["tf 1", "tf 2"], out
  assert [b for _, b, _ in rows].count(True) == 1, out
  import json

  saved = json.loads(path.read_text())
  results = {(r["impl"], r["threads"]): r for r in saved["results"]}
  # The faster by the run's own figures (the table's are rounded: two
  # settings may print alike).
  best = max(rows, key=lambda r: results[("tf_fused", r[0])]["ids_per_s"])
  assert best[1], out
  summary = re.search(
    r"^\| 1000 \| 256 \| tf_fused \| ([^|]+) \| ([\d.]+) \| "
    r"\*\*([\d.]+)x\*\* \| ",
    out,
    re.MULTILINE,
  )
  assert summary and summary.group(1) == best[0], out
  recsys = [r for r in saved["results"] if r["impl"] == "recsys"][0]
  rival = results[("tf_fused", best[0])]
  (ratio,) = [r for r in saved["against_best"] if r["impl"] == "tf_fused"]
  assert ratio["base_is"] == pytest.approx(
    recsys["ids_per_s"] / rival["ids_per_s"]
  )
  slowest = min(
    (r for r in saved["results"] if r["impl"] == "tf_fused"),
    key=lambda r: r["ids_per_s"],
  )
  assert ratio["base_is"] <= recsys["ids_per_s"] / slowest["ids_per_s"]
  assert float(summary.group(3)) == pytest.approx(ratio["base_is"], abs=0.006)


@pytest.mark.slow
def test_embedding_step_measures_each_setting_beside_a_busy_core(tmp_path):
  """`--busy_cores 0,1` runs each setting quiet and beside a spinning
  process; the third table and the JSON give loaded over quiet, taken
  from the two runs' own figures, and the first table stays the quiet one."""
  import json

  path = tmp_path / "out.json"
  out = _run(
    "benchmarks/embedding_step.py",
    "--impls",
    "recsys",
    "--busy_cores",
    "0,1",
    "--json",
    str(path),
    *_TINY_STEP,
  )
  assert len(_setting_rows(out, "recsys")) == 1, out  # the quiet row only
  saved = json.loads(path.read_text())
  by_busy = {r["busy"]: r for r in saved["results"]}
  assert sorted(by_busy) == [0, 1]
  (loaded,) = saved["under_load"]
  assert loaded["busy"] == 1
  assert loaded["of_quiet"] == pytest.approx(
    by_busy[1]["ids_per_s"] / by_busy[0]["ids_per_s"]
  )
  row = re.search(
    r"^\| recsys \| 1000 \| 256 \| [^|]+ \| 1 \| ([\d.]+) \| ([\d.]+) \| "
    r"\*\*([\d.]+)x\*\* \| ",
    out,
    re.MULTILINE,
  )
  assert row, out
  assert float(row.group(3)) == pytest.approx(loaded["of_quiet"], abs=0.006)


def test_spinning_keeps_its_processes_busy_only_inside_the_block():
  """`race.spinning(n)`: n processes busy inside the block (sampled by
  `race.busy_processes`, as the header does), none after. (Shares are
  loose: the test workers take the same 2 cores.)"""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import race  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)

  def spinners():
    return [b for b in race.busy_processes(0.5, 0.2) if "while True" in b[2]]

  with race.spinning(1):
    inside = spinners()
  assert len(inside) == 1, inside
  assert not spinners()


_TINY_DLRM = (
  "benchmarks/dlrm_vs_torchrec.py",
  "--steps",
  "5",
  "--reps",
  "1",
  "--warmup",
  "2",
  "--loop",
  "5",
  "--repeats",
  "1",
)


@pytest.mark.slow
def test_dlrm_vs_torchrec_reports_recsys_with_its_threads():
  out = _run(*_TINY_DLRM, "--sides", "recsys", "--split", "1")
  # 2 slices: what the Trainer picks for the default batch on 2 cores (the
  # CI machine's); 1 where this runs on one core.
  assert re.search(
    r"^\| default \| recsys \| tf \d+/\d+, [12] batch slices? \| "
    r"\*\*best\*\* \| \d+ \| ",
    out,
    re.MULTILINE,
  ), out
  assert re.search(
    r"^\| default \| recsys \| tf \d+/\d+, [12] batch slices? \| [\d.]+ / ",
    out,
    re.M,
  )


@pytest.mark.slow
def test_dlrm_vs_torchrec_takes_the_ratio_against_torchrecs_best():
  if not _has_torchrec():
    pytest.skip("torch, fbgemm_gpu or torchrec missing (benchmarks/README.md)")
  out = _run(*_TINY_DLRM, "--split", "0", "--torch_threads", "1,2")
  rows = re.findall(
    r"^\| default \| torchrec \| (torch \d) [^|]*\| (\*\*best\*\*)? \| "
    r"(\d+) \| ",
    out,
    re.MULTILINE,
  )
  assert [t for t, _, _ in rows] == ["torch 1", "torch 2"], out
  best = max(rows, key=lambda r: int(r[2]))
  assert [b for _, b, _ in rows] == [
    "**best**" if r is best else "" for r in rows
  ], out
  recsys = re.search(
    r"^\| default \| recsys \| [^|]+ \| \*\*best\*\* \| (\d+) \| ", out, re.M
  )
  summary = re.search(
    r"^\| default \| tf [^|]+ \| (\d+) \| (torch \d)[^|]* \| (\d+) \| "
    r"\*\*([\d.]+)x\*\* \| ",
    out,
    re.MULTILINE,
  )
  assert recsys and summary, out
  assert summary.group(2) == best[0] and summary.group(3) == best[2], out
  assert float(summary.group(4)) == pytest.approx(
    int(recsys.group(1)) / int(best[2]), abs=0.006
  )


@pytest.mark.slow
def test_big_table_threads_reports_each_setting():
  """The two settings with a path of their own: `1-core` (the taskset pin)
  and `2-off` (the environment switch); `1` and `2` (the default list's
  others) only pass another thread count. Each is a TF process."""
  out = _run(
    "benchmarks/big_table_threads.py",
    "--settings",
    "1-core,2-off",
    "--rows",
    "20000",
    "--batch",
    "256",
    "--rounds",
    "1",
    "--burst",
    "2",
  )
  settings = re.findall(r"^\| (\S+) \| [\d.]+ \| ", out, re.MULTILINE)
  assert settings == ["1-core", "2-off"], out


@pytest.mark.slow
def test_kernel_ops_threads_times_each_kernel():
  # 10^5 rows, not the default 10^7 (two tables of 1.3 GB each, written
  # whole before the first call).
  out = _run(
    "benchmarks/kernel_ops_threads.py", "1", "1024", "--rows", "100000"
  )
  assert re.findall(r"^(\S+) [\d.]+ ms, [\d.]+ CPU ms$", out, re.MULTILINE), out


@pytest.mark.slow
def test_row_sharding_reports_every_placement_and_the_budget_run():
  out = _run(
    "benchmarks/row_sharding.py",
    "--loop",
    "1",
    "--reps",
    "1",
    "--shard_largest",
    "1",
    "--layouts",
    "strided",
    "--budget",
    "--budget_steps",
    "2",
    "--gin_bindings",
    "SyntheticCTR.vocab_sizes = (300, 40)",
    "--gin_bindings",
    "SyntheticCTR.multi_hot_sizes = (1, 3)",
    "--gin_bindings",
    "train.global_batch_size = 32",
    "--gin_bindings",
    "SyntheticCTR.num_eval_examples = 64",
    "--gin_bindings",  # the budget run's Bayes AUC: not printed
    "SyntheticCTR.oracle_examples = 4096",
  )
  for row in (
    "replicated",
    "sharded/strided/all_to_all",
    "sharded/strided/all_gather",
  ):
    assert re.search(rf"^\| {row} \| [\d.]+ \|", out, re.MULTILINE), out
  assert "1 replica, replicated: refused" in out, out
  assert "2 replicas: the planner row-shards ['C1'" in out, out


#: A tiny iALS matrix: 300 users x 40 items, 3,000 pairs drawn.
_TINY_IALS = ("--users", "300", "--items", "40", "--pairs", "3000")


def test_ials_scale_trains_row_sharded_replicas_on_chunked_histories():
  """The scale run of docs/models.md on a tiny matrix: 2 replicas,
  row-sharded tables, the longest history cut into many chunks."""
  out = _run(
    "benchmarks/ials_scale.py",
    *_TINY_IALS,
    "--replicas",
    "2",
    "--batch_size",
    "64",
    "--history_chunk",
    "8",
  )
  longest = re.search(r"longest history: user \d+, item (\d+) ids", out)
  assert longest and int(longest.group(1)) > 8, out
  assert "2 replica(s), tables row_sharded" in out, out
  assert re.search(r"^seconds per epoch: [\d.]+$", out, re.MULTILINE), out
  assert re.search(r"^peak RSS: [\d,]+ MiB$", out, re.MULTILINE), out


@pytest.mark.slow
def test_weak_scaling_measures_replicas_and_workers_then_projects(tmp_path):
  """Tiny iALS on 2 worker processes (a local cluster, as `recsys launch`
  starts one): its row with measured bytes; the cost model projects from
  that file. (One process's replicas: `ials_scale.py`'s test.)"""
  saved = tmp_path / "weak.json"
  out = _run(
    "benchmarks/weak_scaling.py",
    "--models",
    "ials",
    "--replicas",
    "",
    "--workers",
    "2",
    *_TINY_IALS,
    "--ials_batch",
    "64",
    "--history_chunk",
    "8",
    "--json",
    str(saved),
  )
  (row,) = json.loads(saved.read_text())["rows"]
  assert (row["replicas"], row["processes"]) == (2, 2)
  assert row["collective_bytes"] > 0 and len(row["peak_rss_mib"]) == 2
  assert re.search(r"^\| ials \| 2 \| 2 \| [\d.]+ \|", out, re.MULTILINE), out
  projected = _run(
    "benchmarks/exchange_cost_model.py", "--measured", str(saved)
  )
  for replicas in (64, 256):
    assert re.search(
      rf"^\| ials \| 2 \| [\d.]+ \w+ \| {replicas} \| [\d.]+ \w+ \|",
      projected,
      re.MULTILINE,
    ), projected


def _tasks_under(folder) -> list:
  """Pids of weak_scaling tasks whose output folder is under `folder`."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode(errors="replace").split("\0")
    except OSError:
      continue
    if "--task" in argv and any(str(folder) in a for a in argv):
      pids.append(int(pid))
  return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_weak_scaling_stopped_leaves_no_task_running(signum, tmp_path):
  """A signal while a measuring process runs: it is forwarded, the script
  exits 143 / 130 and no task outlives it."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  env["TMPDIR"] = str(tmp_path)  # the tasks' output folders: found below
  proc = subprocess.Popen(
    [
      sys.executable,
      "benchmarks/weak_scaling.py",
      "--models",
      "ials",
      "--replicas",
      "1",
      "--workers",
      "0",
      *_TINY_IALS,
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 120
    while not _tasks_under(tmp_path):
      assert proc.poll() is None and time.monotonic() < deadline
      time.sleep(0.05)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == (143 if signum == signal.SIGTERM else 130)
    deadline = time.monotonic() + 10
    while _tasks_under(tmp_path) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _tasks_under(tmp_path)
  finally:
    proc.kill()
    proc.wait()
