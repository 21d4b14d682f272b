"""`recsys launch` keeps TF's unauthenticated gRPC servers off the network.

TF's servers listen on every interface (no bind-address setting) and have no
authentication, so launch runs its tasks in a network namespace that has only
a loopback interface unless told `--listen_all_interfaces`; where it cannot
make one, it refuses to start rather than expose the tasks.
"""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from recsys import cli
from recsys import launch as launch_lib

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _interfaces(pid="self"):
  with open(f"/proc/{pid}/net/dev", encoding="ascii") as f:
    return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def _pump(stream, lines: queue.Queue) -> None:
  """Every line of `stream` into `lines`, then None at its end."""
  for line in stream:
    lines.put(line)
  lines.put(None)


def _task_interfaces(*flags):
  """The network interfaces a launched task sees (read while it starts)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop(launch_lib._PRIVATE_ENV, None)  # pylint: disable=protected-access
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "recsys",
      "launch",
      *flags,
      "--workers",
      "1",
      "--ps",
      "0",
      "--",
      "info",
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  # Lines arrive through a thread: a launch that hangs silently must fail
  # the test at the deadline, not block it on a read.
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
  seen = []
  try:
    deadline = time.monotonic() + 120
    while True:
      try:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        raise AssertionError(
          f"no task started within 120 s; launch printed: {seen}"
        ) from None
      if line is None:
        raise AssertionError(
          f"launch ended without a task ({proc.wait()}): {seen}"
        )
      seen.append(line.rstrip())
      match = re.search(r"\[launch\] worker 0 pid (\d+)", line)
      if match:
        return _interfaces(match.group(1))
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.skipif(
  not os.path.isdir("/proc/self/net"), reason="needs Linux /proc"
)
def test_tasks_see_only_loopback_by_default_and_every_interface_when_asked():
  problem = launch_lib._namespace_problem()  # pylint: disable=protected-access
  if problem:
    pytest.skip(f"no loopback-only namespace here: {problem}")
  assert _task_interfaces() == ["lo"]
  assert _task_interfaces("--listen_all_interfaces") == _interfaces()


def test_launch_refuses_to_expose_tasks_it_cannot_isolate(monkeypatch, capsys):
  monkeypatch.delenv(launch_lib._PRIVATE_ENV, raising=False)  # pylint: disable=protected-access
  monkeypatch.setattr(
    launch_lib, "_namespace_problem", lambda: "user namespaces are disabled"
  )
  assert cli.main(["launch", "--workers", "1", "--ps", "0", "--", "info"]) == 2
  err = capsys.readouterr().err
  assert "user namespaces are disabled" in err
  assert "--listen_all_interfaces" in err and "no authentication" in err
  assert (
    cli.main(
      ["launch", "--private_network", "--listen_all_interfaces", "--", "info"]
    )
    == 2
  )
  assert "contradict" in capsys.readouterr().err
