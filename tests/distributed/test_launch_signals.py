"""`recsys launch` owns its tasks: signals, its own death, its status.

SIGTERM or Ctrl-C to the launcher reaches the chief, which saves before
anything else is stopped; no task outlives the launcher, even one it could
not stop itself (SIGKILLed: the kernel's parent-death signal, or the
guard's watcher); the launcher's status is the same whichever task fails
first. The tasks here are small Python scripts that behave as recsys's do
on a signal (no TensorFlow: a fraction of a second each); each launcher is
a process of its own so it can be signalled and killed.
tests/distributed/test_row_sharded_cluster.py sends SIGTERM to a real
cluster's launcher.
"""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from recsys import launch, launch_guard

#: A task. The chief (or worker 0 of a mirrored cluster) saves a
#: "checkpoint" on SIGTERM or SIGINT, noting which other tasks are still
#: alive, and exits 128 + the signal, as `recsys train` does; a parameter
#: server or a parameter-server cluster's worker dies at SIGTERM (it serves
#: from C++, where no Python handler runs); a mirrored worker exits 143.
#: SLOW_SAVE: the chief's seconds to save; STUBBORN names a task that
#: ignores SIGTERM (blocked in a collective);
#: FAIL_<job>_<index> = "status delay" makes a task exit with that status.
TASK = textwrap.dedent("""
  import json, os, signal, sys, time
  config = json.loads(os.environ["TF_CONFIG"])
  job, index = config["task"]["type"], config["task"]["index"]
  name = f"{job}_{index}"
  state = os.environ["STATE"]
  chief = job == "chief" or (name == "worker_0" and "chief" not in config["cluster"])

  def alive(pid):
    try:
      with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] not in "ZX"
    except FileNotFoundError:
      return False

  def save(signum, frame):
    time.sleep(float(os.environ.get("SLOW_SAVE", 0)))
    others = {}
    for f in os.listdir(state):
      if f.endswith(".pid") and f != name + ".pid":
        others[f[:-4]] = alive(int(open(os.path.join(state, f)).read()))
    with open(os.path.join(state, "checkpoint"), "w") as f:
      json.dump({"signal": signal.Signals(signum).name, "alive": others}, f)
    sys.exit(128 + signum)

  if chief:
    signal.signal(signal.SIGTERM, save)
    signal.signal(signal.SIGINT, save)
  elif job == "ps" or "ps" in config["cluster"]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  else:
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
  if os.environ.get("STUBBORN") == name:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
  with open(os.path.join(state, name + ".pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
  os.rename(os.path.join(state, name + ".pid.tmp"), os.path.join(state, name + ".pid"))
  fail = os.environ.get(f"FAIL_{name}")
  if fail:
    status, delay = fail.split()
    time.sleep(float(delay))
    print(f"{name} fails with status {status}", flush=True)
    sys.exit(int(status))
  while True:
    time.sleep(0.05)
""")

#: A launcher of fake tasks: `supervise` (in the main thread, or in another
#: thread with `--thread`, where the guard's watcher replaces the kernel's
#: parent-death signal). It writes its pid to <state>/launcher.pid.
LAUNCHER = textwrap.dedent("""
  import os, sys, threading
  from recsys import launch
  state, workers, ps, grace = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
  launch.STOP_SECONDS = 1.0
  with open(os.path.join(state, "launcher.pid"), "w") as f:
    f.write(str(os.getpid()))
  cluster = launch.Cluster(
    launch.cluster_spec(workers, ps),
    ["train", "--model_dir", os.path.join(state, "run")],
    program=[sys.executable, "-c", sys.argv[5]],
    grace_seconds=grace,
  )
  if "--thread" in sys.argv:
    thread = threading.Thread(target=launch.supervise, args=(cluster,), kwargs={"poll_seconds": 0.05})
    thread.start()
    thread.join()
  else:
    sys.exit(launch.supervise(cluster, poll_seconds=0.05))
""")

#: The outer launcher: runs LAUNCHER as `recsys launch` runs the one inside
#: its private network.
OUTER = textwrap.dedent("""
  import sys
  from recsys import launch
  sys.exit(launch.run_owned(sys.argv[1:], stop_seconds=20))
""")

#: Every wait of these tests ends by this deadline (seconds).
DEADLINE = 30


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie has ended)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except FileNotFoundError:
    return False


def _pids(state, names):
  """The pids the tasks `names` wrote once started (waits for them)."""
  deadline = time.monotonic() + DEADLINE
  while time.monotonic() < deadline:
    files = [state / f"{name}.pid" for name in names]
    if all(f.exists() for f in files):
      return {name: int(f.read_text()) for name, f in zip(names, files)}
    time.sleep(0.02)
  raise AssertionError(f"not every task started: {os.listdir(state)}")


def _gone(pids):
  """Waits for every pid to end; the ones still running at the deadline."""
  deadline = time.monotonic() + DEADLINE
  while time.monotonic() < deadline:
    left = {n: p for n, p in pids.items() if _alive(p)}
    if not left:
      return {}
    time.sleep(0.05)
  return left


class _Launcher:
  """A launcher process of fake tasks; at exit, every task it started that
  is still running is killed (the test has failed then)."""

  def __init__(
    self, state, workers, ps, grace=5.0, outer=False, thread=False, env=None
  ):
    self.state = state
    argv = [sys.executable, "-c", LAUNCHER, str(state), str(workers), str(ps)]
    argv += [str(grace), TASK, *(["--thread"] if thread else [])]
    if outer:
      argv = [sys.executable, "-c", OUTER, *argv]
    self.names = [f"worker_{i}" for i in range(workers)]
    self.names += [f"ps_{i}" for i in range(ps)] + (["chief_0"] if ps else [])
    self.proc = subprocess.Popen(
      argv,
      env=dict(os.environ, STATE=str(state), **(env or {})),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      start_new_session=True,
    )
    self.pids = {}

  def started(self):
    """Waits until every task (and the launcher) has started."""
    self.pids = _pids(self.state, [*self.names, "launcher"])
    return self

  def finish(self):
    out, _ = self.proc.communicate(timeout=DEADLINE)
    return self.proc.returncode, out

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for pid in self.pids.values():
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.communicate()


def _checkpoint(state):
  return json.loads((state / "checkpoint").read_text())


@pytest.mark.parametrize(
  "sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)]
)
def test_a_signal_reaches_the_chief_which_saves_before_the_rest_stop(
  tmp_path, sig, status
):
  with _Launcher(tmp_path, workers=2, ps=1) as launcher:
    launcher.started()
    start = time.monotonic()
    launcher.proc.send_signal(sig)
    code, out = launcher.finish()
    seconds = time.monotonic() - start
    assert code == status, out
    assert not _gone(launcher.pids), out
  # The chief saved while every other task still ran, then they stopped.
  saved = _checkpoint(tmp_path)
  assert saved["signal"] == sig.name
  assert saved["alive"] == {
    "launcher": True,
    "worker_0": True,
    "worker_1": True,
    "ps_0": True,
  }
  assert f"[launch] {sig.name} received: stopping the cluster" in out
  assert f"every task has ended (status {status})" in out
  assert seconds < 5, (seconds, out)  # none needed its SIGKILL


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
  """A mirrored worker blocked in a collective runs no Python handler."""
  stubborn = {"STUBBORN": "worker_1"}
  with _Launcher(tmp_path, workers=2, ps=0, env=stubborn) as launcher:
    launcher.started()
    start = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    code, out = launcher.finish()
    seconds = time.monotonic() - start
    assert code == 143, out
    assert not _gone(launcher.pids), out
  assert _checkpoint(tmp_path)["signal"] == "SIGTERM"
  # The launcher's STOP_SECONDS (1 s here) between SIGTERM and SIGKILL.
  assert 1.0 <= seconds < 5, (seconds, out)


@pytest.mark.parametrize("thread", [False, True], ids=["prctl", "watchdog"])
def test_no_task_outlives_a_sigkilled_launcher(tmp_path, thread):
  with _Launcher(tmp_path, workers=2, ps=0, thread=thread) as launcher:
    launcher.started()
    launcher.proc.kill()
    launcher.finish()
    assert not _gone(launcher.pids)
  # Every task got SIGTERM: the chief saved, as a trainer would.
  assert _checkpoint(tmp_path)["signal"] == "SIGTERM"


def test_a_terminals_ctrl_c_reaches_the_cluster_once(tmp_path):
  """Ctrl-C in a terminal signals its foreground process group: the outer
  launcher's (the inner one runs in a session of its own), which forwards
  it once; twice would kill every task at once (next test)."""
  with _Launcher(tmp_path, workers=2, ps=1, outer=True) as launcher:
    launcher.started()
    os.killpg(launcher.proc.pid, signal.SIGINT)
    code, out = launcher.finish()
    assert code == 130, out
    assert not _gone(launcher.pids), out
  assert "every task has ended (status 130)" in out
  assert "killing every task now" not in out, out
  saved = _checkpoint(tmp_path)
  assert saved["signal"] == "SIGINT" and all(saved["alive"].values()), saved


def test_ctrl_c_again_kills_every_task_at_once(tmp_path):
  slow = {"SLOW_SAVE": "60"}  # a chief that would take its whole grace
  with _Launcher(tmp_path, workers=2, ps=0, grace=20, env=slow) as launcher:
    launcher.started()
    start = time.monotonic()
    launcher.proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    launcher.proc.send_signal(signal.SIGINT)
    code, out = launcher.finish()
    seconds = time.monotonic() - start
    assert code == 130, out
    assert not _gone(launcher.pids), out
  assert "[launch] Ctrl-C again: killing every task now" in out
  assert seconds < 5, (seconds, out)
  assert not (tmp_path / "checkpoint").exists()


def test_a_sigkilled_outer_launcher_stops_the_cluster_in_order(tmp_path):
  """The inner launcher gets SIGTERM from the kernel and stops its tasks as
  on a forwarded SIGTERM: the chief saves while the others still run."""
  with _Launcher(tmp_path, workers=2, ps=1, outer=True) as launcher:
    launcher.started()
    launcher.proc.kill()
    launcher.finish()
    assert not _gone(launcher.pids)
  saved = _checkpoint(tmp_path)
  assert saved["signal"] == "SIGTERM"
  assert {n: a for n, a in saved["alive"].items() if n != "launcher"} == {
    "worker_0": True,
    "worker_1": True,
    "ps_0": True,
  }


def test_a_sigkilled_inner_launcher_leaves_no_task_and_is_reported(tmp_path):
  with _Launcher(tmp_path, workers=2, ps=0, outer=True) as launcher:
    os.kill(launcher.started().pids["launcher"], signal.SIGKILL)
    code, out = launcher.finish()
    assert not _gone(launcher.pids), out
  assert code == 1, out
  assert "was ended by SIGKILL; its tasks got SIGTERM" in out
  assert _checkpoint(tmp_path)["signal"] == "SIGTERM"


def _status(tmp_path, monkeypatch, **fail):
  """The status of a 2-worker mirrored launch whose tasks fail as told."""
  for name, how in fail.items():
    monkeypatch.setenv(f"FAIL_{name}", how)
  monkeypatch.setenv("STATE", str(tmp_path))
  cluster = launch.Cluster(
    launch.cluster_spec(2, 0),
    ["train", "--model_dir", str(tmp_path / "run")],
    out=io.StringIO(),
    program=[sys.executable, "-c", TASK],
    grace_seconds=5,
  )
  return launch.supervise(cluster, poll_seconds=0.05)


@pytest.mark.parametrize(
  "fail",
  [
    {"worker_0": "1 0", "worker_1": "2 0.3"},
    {"worker_0": "2 0.3", "worker_1": "1 0"},
    {"worker_0": "2 0", "worker_1": "1 0.3"},
    {"worker_0": "1 0.3", "worker_1": "2 0"},
  ],
  ids=["chief-1-first", "worker-1-first", "chief-2-first", "worker-2-first"],
)
def test_a_settings_error_is_status_2_whichever_task_reports_first(
  tmp_path, monkeypatch, fail
):
  assert _status(tmp_path, monkeypatch, **fail) == 2


def test_otherwise_the_status_of_the_task_that_failed(tmp_path, monkeypatch):
  # Worker 1 fails; the chief, stopped, saves and exits 143: the cause is 1.
  assert _status(tmp_path, monkeypatch, worker_1="1 0") == 1
  assert _checkpoint(tmp_path)["signal"] == "SIGTERM"
  assert launch.cluster_status(-9, [None, -9]) == 1  # killed: no status
  assert launch.cluster_status(0, [0, -15, 2]) == 0  # the chief succeeded


def test_the_guard_refuses_to_start_a_task_whose_launcher_is_gone(tmp_path):
  """A task whose launcher died before it started never starts."""
  lifeline, keep = os.pipe()
  try:
    proc = subprocess.run(
      launch_guard.argv(
        [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"],
        parent=1,  # not this process: as if the launcher had ended
        lifeline=lifeline,
        grace_seconds=1,
      ),
      pass_fds=(lifeline,),
      capture_output=True,
      text=True,
      timeout=DEADLINE,
      check=False,
    )
  finally:
    os.close(lifeline)
    os.close(keep)
  assert proc.returncode == 143, proc.stderr
  assert "ended before" in proc.stderr
  assert not (tmp_path / "ran").exists()
