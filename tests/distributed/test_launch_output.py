"""What `recsys launch` prints: the chief's lines; the others' in files.

Every task runs the same command, so a cluster's tasks print the same lines
N times; the launcher prints the chief's and writes each other task's output
to `<model_dir>/logs/<job>-<index>.log`, printing of it only error lines and
the last lines of a task that fails. The tasks here are small Python scripts
that print as recsys does (no TensorFlow: a fraction of a second each);
tests/distributed/test_row_sharded_cluster.py and test_cluster.py check the
same on real clusters.
"""

import io
import json
import os
import re
import sys
import textwrap

import pytest

from recsys import launch

#: A task: prints what a recsys run prints, and fails where told to. The
#: chief ends after worker 1 (the launcher stops the others when it ends).
TASK = textwrap.dedent("""
  import json, os, sys, time
  task = json.loads(os.environ["TF_CONFIG"])["task"]
  name = f"{task['type']} {task['index']}"
  print(f"12:00:00 recsys.training INFO step 10/20 on {name}", flush=True)
  print(f"12:00:01 recsys.backends WARNING a warning of {name}", flush=True)
  if task["index"] == 1:
    print("12:00:02 recsys.training ERROR the disk of worker 1 is full")
    if "--fail" in sys.argv:
      raise ValueError("worker 1 cannot go on")
  else:
    deadline = time.time() + (60 if "--fail" in sys.argv else 30)
    while not os.path.exists(os.environ["WORKER_1_DONE"]):
      assert time.time() < deadline, "worker 1 did not finish"
      time.sleep(0.02)
  print(f"metrics of {name}: " + json.dumps({"args": sys.argv[1:]}))
  if task["index"] == 1:
    sys.stdout.flush()
    open(os.environ["WORKER_1_DONE"], "w").close()
""")


def _cluster(tmp_path, *flags):
  out = io.StringIO()
  model_dir = tmp_path / "run"
  done = tmp_path / "worker_1_done"
  done.unlink(missing_ok=True)
  cluster = launch.Cluster(
    launch.cluster_spec(2, 0),
    ["train", "--model_dir", str(model_dir), *flags],
    out=out,
    env=dict(os.environ, WORKER_1_DONE=str(done)),
    program=[sys.executable, "-c", TASK],
  )
  try:
    cluster.start()
    code = cluster.wait(poll_seconds=0.05)
  finally:
    cluster.stop(grace_seconds=5)
  return code, out.getvalue(), model_dir / "logs" / "worker-1.log"


def test_the_chiefs_lines_are_printed_and_the_others_go_to_files(tmp_path):
  code, printed, log = _cluster(tmp_path)
  assert code == 0, printed
  lines = printed.splitlines()
  # (Worker 0 may print before the launcher's line for worker 1.)
  started = [line for line in lines if line.startswith("[launch] worker 1 pid")]
  assert len(started) == 1 and re.fullmatch(
    rf"\[launch\] worker 1 pid \d+ at 127\.0\.0\.1:\d+: output in {re.escape(str(log))}",
    started[0],
  ), lines
  # Worker 0's lines, once; of worker 1's, its error only.
  assert [line for line in lines if line.startswith("[worker 0]")][:2] == [
    "[worker 0] 12:00:00 recsys.training INFO step 10/20 on worker 0",
    "[worker 0] 12:00:01 recsys.backends WARNING a warning of worker 0",
  ]
  of_worker_1 = [
    line
    for line in lines
    if "worker 1" in line and not line.startswith("[launch]")
  ]
  assert of_worker_1 == [
    "[worker 1] 12:00:02 recsys.training ERROR the disk of worker 1 is full"
  ]
  # Worker 1's whole output is in its file, after a header naming the run.
  written = log.read_text().splitlines()
  assert written[0].startswith("--- recsys launch ")
  assert "worker 1, pid" in written[0] and "train --model_dir" in written[0]
  assert written[1:4] == [
    "12:00:00 recsys.training INFO step 10/20 on worker 1",
    "12:00:01 recsys.backends WARNING a warning of worker 1",
    "12:00:02 recsys.training ERROR the disk of worker 1 is full",
  ]
  assert json.loads(written[4].split(": ", 1)[1])["args"][0] == "train"

  # A second launch into the same run appends: both runs' lines are kept.
  assert _cluster(tmp_path)[0] == 0
  assert log.read_text().count("--- recsys launch ") == 2


def test_a_failed_worker_is_named_with_its_last_lines(tmp_path):
  code, printed, log = _cluster(tmp_path, "--fail")
  assert code == 1, printed
  assert (
    "[launch] worker 1 exited with status 1; a mirrored worker cannot be "
    "lost: stopping the cluster" in printed
  )
  assert f"[launch] worker 1's last lines ({log} has them all):" in printed
  tail = printed.split("has them all):\n", 1)[1]
  assert "[worker 1] Traceback (most recent call last):" in tail
  assert "[worker 1] ValueError: worker 1 cannot go on" in tail
  assert "ValueError: worker 1 cannot go on" in log.read_text()


def test_a_model_dir_it_cannot_write_is_refused_before_any_task_starts(
  tmp_path,
):
  (tmp_path / "run").write_text("a file, not a folder")
  cluster = launch.Cluster(
    launch.cluster_spec(2, 0),
    ["train", f"--model_dir={tmp_path / 'run'}"],
    out=io.StringIO(),
    program=[sys.executable, "-c", "unused"],
  )
  with pytest.raises(launch.LaunchError, match="give a --model_dir"):
    cluster.start()
  assert not cluster.procs
  assert cluster.log_dir == str(tmp_path / "run" / "logs")


def test_a_remote_or_missing_model_dir_logs_to_a_temporary_folder():
  for command in (["info"], ["train", "--model_dir", "gs://bucket/run"]):
    folder = launch.log_dir_for(command)
    assert os.path.isdir(folder) and "recsys-launch-" in folder
    os.rmdir(folder)
