"""Local test clusters: free loopback ports, in-process servers, TF_CONFIG.

`in_process_cluster` starts `tf.distribute.Server`s for workers and parameter
servers inside the calling process (which then acts as the coordinator), for
unit tests of the parameter_servers backend in one process. Connecting to a
cluster rewires TensorFlow's eager context for the rest of the process, so tests
run it in a subprocess (`run_script`), never in the pytest process.

TensorFlow's gRPC server listens on every interface (`0.0.0.0:<port>`; it has
no bind-address option). `run_script` therefore runs the cluster in a private
network namespace whose only interface is loopback (`unshare -rn`) when the
kernel allows it, so nothing is reachable from outside; otherwise (no user
namespaces) it runs it as is, on 127.0.0.1 addresses, and says so.
"""

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from recsys.launch import free_ports

REPO = Path(__file__).resolve().parents[2]


def cluster_spec(
  workers: int, ps: int, chief: bool = False
) -> dict[str, list[str]]:
  """A cluster dict of 127.0.0.1 addresses on free ports."""
  ports = iter(free_ports(workers + ps + int(chief)))
  spec = {}
  if chief:
    spec["chief"] = [f"127.0.0.1:{next(ports)}"]
  spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
  spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
  return spec


def in_process_cluster(workers: int = 2, ps: int = 2):
  """Starts worker and ps servers in this process; returns (spec, servers).

  Call before any other TensorFlow work of the process; the caller becomes
  the coordinator of a `ParameterServerStrategy` over them.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  spec = cluster_spec(workers, ps)
  cluster = tf.train.ClusterSpec(spec)
  config = tf.compat.v1.ConfigProto()
  # Workers deadlock with too few inter-op threads (TF's own test clusters
  # give them workers + 1).
  config.inter_op_parallelism_threads = workers + 1
  servers = [
    tf.distribute.Server(
      cluster,
      job_name=job,
      task_index=i,
      protocol="grpc",
      config=config,
      start=True,
    )
    for job in ("worker", "ps")
    for i in range(len(spec[job]))
  ]
  return spec, servers


@functools.cache
def loopback_namespace_prefix() -> list[str] | None:
  """`unshare` argv running a command with only a loopback interface, or
  None."""
  if shutil.which("unshare") is None or shutil.which("ip") is None:
    return None
  probe = subprocess.run(
    ["unshare", "-rn", "sh", "-c", "ip link set lo up && echo ok"],
    capture_output=True,
    text=True,
    timeout=30,
    check=False,
  )
  if probe.returncode != 0 or "ok" not in probe.stdout:
    return None
  return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def _pythonpath() -> str:
  """The repo, then this process's PYTHONPATH (tests/conftest.py's
  CHILD_SITE among it)."""
  return os.pathsep.join(
    filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
  )


def subprocess_env(**extra: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=_pythonpath(), **extra)
  return env


def run_script(
  argv: Sequence[str], timeout: float = 240, isolate: bool = True
) -> str:
  """Runs `python <argv>` (in a loopback-only namespace if possible).

  Returns its combined output; raises AssertionError with the output's tail
  if it fails or times out (the process group is killed).
  """
  cmd = [sys.executable, *argv]
  prefix = loopback_namespace_prefix() if isolate else None
  if prefix:
    cmd = prefix + cmd
  proc = subprocess.Popen(
    cmd,
    env=subprocess_env(),
    cwd=str(REPO),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  try:
    out, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    kill_group(proc)
    out, _ = proc.communicate()
    raise AssertionError(
      f"{argv} timed out after {timeout} s:\n{out[-4000:]}"
    ) from None
  finally:
    kill_group(proc)
  if proc.returncode != 0:
    raise AssertionError(f"{argv} failed ({proc.returncode}):\n{out[-6000:]}")
  return out


def run_workers(
  commands: Sequence[Sequence[str]],
  envs: Sequence[dict[str, str]],
  cwd: str | None = None,
  timeout: float = 300,
) -> None:
  """Runs one process per command (with its env) at once; all must succeed.

  For a multi-worker cluster, whose tasks wait for each other: raises
  AssertionError with a failing task's output tail; kills any left running.
  """
  procs = []
  try:
    for cmd, env in zip(commands, envs):
      procs.append(
        subprocess.Popen(
          list(cmd),
          env=env,
          cwd=cwd,
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
        )
      )
    for proc in procs:
      out, _ = proc.communicate(timeout=timeout)
      assert proc.returncode == 0, out[-3000:]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()


def kill_group(proc: subprocess.Popen) -> None:
  """Kills `proc`'s process group (it was started in a new session)."""
  if proc.poll() is not None:
    return
  try:
    os.killpg(proc.pid, 9)
  except ProcessLookupError:
    pass
  proc.wait(timeout=30)
