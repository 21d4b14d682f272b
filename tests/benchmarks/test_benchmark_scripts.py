"""The README's benchmark commands run as a user runs them: each script in a
fresh process (no conftest set-up), on a tiny workload. Only that they run
and report every row is checked; their figures are measurements, not test
results."""

import os
import re
import subprocess
import sys

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


@pytest.mark.slow
def test_embedding_step_reports_recsys():
  out = _run(
    "benchmarks/embedding_step.py",
    "--impls",
    "recsys",
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
  assert re.search(r"^\| recsys \| 1000 \| 256 \| ", out, re.MULTILINE), out


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
  out = _run("benchmarks/kernel_ops_threads.py", "1", "1024")
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
  )
  for row in (
    "replicated",
    "sharded/strided/all_to_all",
    "sharded/strided/all_gather",
  ):
    assert re.search(rf"^\| {row} \| [\d.]+ \|", out, re.MULTILINE), out
  assert "1 replica, replicated: refused" in out, out
  assert "2 replicas: the planner row-shards ['C1'" in out, out
