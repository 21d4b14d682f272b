"""The local launcher: a small TF_CONFIG cluster of processes on this machine.

`recsys launch --workers 2 --ps 2 -- train --gin_file ... --model_dir ...`
starts one process per task, each `python -m recsys <command...>` with its
own `TF_CONFIG` (the standard convention, so the same command runs on real
hosts with TF_CONFIG set by the cluster manager):

* with `--ps N > 0`: a parameter-server cluster: a "chief" (the coordinator,
  which runs the training loop and writes the model dir), `--workers`
  "worker" tasks and N "ps" tasks (which serve, see
  `recsys.run.strategy.serve`); `recsys train` picks
  `ParameterServerStrategy` and the `parameter_servers` backend;
* with `--ps 0`: `--workers` "worker" tasks of a
  `MultiWorkerMirroredStrategy` (`tensorcore` tables replicated or
  row-sharded over the workers, input sharded per worker), worker 0 being
  the chief.

The launcher prints the chief's lines (the chief, or worker 0 without one),
prefixed with its name (`[chief]`, `[worker 0]`): the other tasks run the
same command and would repeat them. Their output goes to one file each,
`<model_dir>/logs/worker-1.log`, `ps-0.log`, ... (the `--model_dir` of the
command; a temporary folder without one), appended run after run; of it the
launcher prints only error lines, and the last lines of a task that exits
with an error (`[worker 1] ...`). In a parameter-server cluster a worker
may die: the chief's coordinator moves its work to the others.

The launcher owns its processes (`supervise`): it stops every one when the
chief exits, when a task it cannot lose fails (a parameter server, or any
worker of a mirrored cluster), and on SIGTERM or Ctrl-C (SIGINT), which it
forwards to the chief: the chief saves a checkpoint within
`--grace_seconds` (a mirrored cluster's workers save with it: they agree on
the stop), then every task still running gets SIGTERM and, `STOP_SECONDS`
later, SIGKILL; the launcher then exits 143 (SIGTERM) or 130 (SIGINT). A
second Ctrl-C skips the waits. If the launcher itself is killed, even by
SIGKILL, its tasks get SIGTERM from the kernel (`recsys.launch_guard`), so
none outlives it. Its status is the same for the same cause whichever task
reports it first (`cluster_status`): 2 when any task reported a settings
error.

Addresses are 127.0.0.1 on free ports. TensorFlow's gRPC server listens on
every interface of the machine, though (it has no bind-address setting), and
has no authentication: anyone who reaches a port can run ops in the task. So
by default the whole cluster runs in a new network namespace with only a
loopback interface (`unshare -rn`, Linux with user namespaces): nothing
outside can reach it. The `recsys launch` you start then runs the launcher
proper in it, as its own process (`run_owned`: signals forwarded, ended
with it). Where no namespace can be made, launch refuses to
start; `--listen_all_interfaces` runs the servers on every interface instead
(a trusted network only, e.g. to reach the tasks from other hosts).

Example:
  recsys launch --workers 2 --ps 2 -- train \\
      --gin_file experiments/synthetic_dlrm.gin --model_dir runs/ps
"""

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from recsys import launch_guard
from recsys.errors import (
  RUNTIME_EXIT_STATUS,
  SETTINGS_EXIT_STATUS,
  SettingsError,
)
from recsys.process import exits

_PRIVATE_ENV = "RECSYS_LAUNCH_PRIVATE_NETWORK"

#: After the chief's grace, how long the tasks still running have between
#: SIGTERM and SIGKILL (a parameter server ends at once; a worker blocked in
#: a collective whose peer is gone never handles it).
STOP_SECONDS = 5.0
#: How long the tasks still running may take to end by themselves after one
#: failed with another status than a settings error's: every task runs the
#: same command, so one that fails on a setting usually has company, and the
#: launcher's status must not depend on which reports first.
SETTLE_SECONDS = 1.0
#: How often the launcher looks at its tasks while it stops them.
_STOP_POLL_SECONDS = 0.05


class LaunchError(SettingsError, RuntimeError):
  """The cluster could not be started as asked."""


def free_ports(n: int) -> list[int]:
  """`n` distinct free TCP ports on 127.0.0.1."""
  socks = [socket.socket() for _ in range(n)]
  try:
    for s in socks:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def cluster_spec(workers: int, ps: int) -> dict[str, list[str]]:
  """The TF_CONFIG cluster: chief + workers + ps, or workers only (ps=0)."""
  if workers < 1 or ps < 0:
    raise LaunchError(
      f"need --workers >= 1 and --ps >= 0; got workers={workers}, ps={ps}."
    )
  ports = iter(free_ports(workers + ps + (1 if ps else 0)))
  spec = {}
  if ps:
    spec["chief"] = [f"127.0.0.1:{next(ports)}"]
  spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
  if ps:
    spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
  return spec


def tasks(spec: dict[str, list[str]]) -> list[tuple[str, int]]:
  """Every (task type, index), the chief (or worker 0) first."""
  order = ["chief", "worker", "ps"]
  return [(job, i) for job in order for i in range(len(spec.get(job, [])))]


def task_name(job: str, index: int) -> str:
  return "chief" if job == "chief" else f"{job} {index}"


#: A line TensorFlow's C++ runtime logs as a parameter-server cluster shuts
#: down ("E0000 ... Failed to clear function handle cache"), after the run's
#: checkpoints and metrics are written and although the run succeeded: an
#: error-level line that reports no error of the run.
_SHUTDOWN_NOISE = re.compile(r"^E\d{4} .*Failed to clear function handle cache")


def is_shutdown_noise(line: str) -> bool:
  """Whether a task's log line is TF's harmless end-of-cluster message."""
  return bool(_SHUTDOWN_NOISE.match(line))


#: An error-level line: recsys's log format (`12:00:00 recsys ERROR ...`),
#: Python's default logging format (`ERROR:tensorflow:...`), TF's C++ log
#: (`E0000 ...`, `F0000 ...`). A task's uncaught exception ends it with an
#: error: its last lines are printed then (`Cluster.wait`).
_ERROR_LINE = re.compile(
  r"^(\d\d:\d\d:\d\d \S+ (ERROR|CRITICAL) |(ERROR|CRITICAL|FATAL):|[EF]\d{4} )"
)


def is_error_line(line: str) -> bool:
  """Whether a line of a task that is not the chief is printed: an error."""
  return bool(_ERROR_LINE.match(line)) and not is_shutdown_noise(line)


#: The last lines of a task's output printed when it exits with an error.
TAIL_LINES = 12


def model_dir_of(command: Sequence[str]) -> str | None:
  """The `--model_dir` of a recsys command line, or None."""
  for i, arg in enumerate(command):
    if arg == "--model_dir" and i + 1 < len(command):
      return command[i + 1]
    if arg.startswith("--model_dir="):
      return arg.split("=", 1)[1]
  return None


def log_dir_for(command: Sequence[str]) -> str:
  """Where the tasks other than the chief write their output: the command's
  `<model_dir>/logs`, else (no model dir, or one on a remote file system
  such as gs://) a new temporary folder."""
  model_dir = model_dir_of(command)
  if model_dir and "://" not in model_dir:
    return os.path.join(model_dir, "logs")
  return tempfile.mkdtemp(prefix="recsys-launch-")


def log_file_name(job: str, index: int) -> str:
  return f"{job}-{index}.log"


class Cluster:
  """Processes of a local cluster; `stop()` ends every one of them.

  Each task runs under `recsys.launch_guard`, so it ends with the process
  that started it (this one), whatever ends that.

  Args:
    spec: the cluster dict (see `cluster_spec`).
    command: the `recsys` command line each task runs (e.g. ["train", ...]).
    out: where the chief's prefixed lines (and the others' errors) go.
    env: base environment (TF_CONFIG is set per task).
    log_dir: where the other tasks' output goes, one file each (None: see
      `log_dir_for`).
    program: what each task runs the command with (`python -m recsys`).
    grace_seconds: how long the chief has to save a checkpoint when the
      cluster is stopped, by `stop()` or by this process's death.
  """

  def __init__(
    self,
    spec: dict[str, list[str]],
    command: Sequence[str],
    out: TextIO = sys.stdout,
    env: dict[str, str] | None = None,
    log_dir: str | None = None,
    program: Sequence[str] = (sys.executable, "-m", "recsys"),
    grace_seconds: float = 10.0,
  ):
    self.spec = spec
    self.command = list(command)
    self.out = out
    self.env = dict(env if env is not None else os.environ)
    self.log_dir = log_dir or log_dir_for(self.command)
    self.program = list(program)
    self.grace_seconds = grace_seconds
    self.procs: dict[tuple[str, int], subprocess.Popen] = {}
    self._tails: dict[tuple[str, int], collections.deque] = {}
    self._logs: dict[tuple[str, int], TextIO] = {}
    self._threads: dict[tuple[str, int], threading.Thread] = {}
    self._lock = threading.Lock()
    self._lifeline: int | None = None  # the pipe's write end: see start()

  @property
  def chief(self) -> tuple[str, int]:
    return ("chief", 0) if "chief" in self.spec else ("worker", 0)

  @property
  def parameter_server_mode(self) -> bool:
    return bool(self.spec.get("ps"))

  def log_path(self, job: str, index: int) -> str:
    """The file a task other than the chief writes its output to."""
    return os.path.join(self.log_dir, log_file_name(job, index))

  def _open_logs(self) -> None:
    """Opens every other task's log file (appending), before any starts.

    Raises:
      LaunchError: the folder cannot be written, naming it.
    """
    try:
      os.makedirs(self.log_dir, exist_ok=True)
      for key in tasks(self.spec):
        if key != self.chief:
          self._logs[key] = open(self.log_path(*key), "a", encoding="utf-8")
    except OSError as e:
      for log in self._logs.values():
        log.close()
      raise LaunchError(
        f"cannot write the tasks' output to {self.log_dir} ({e}); the "
        "launcher keeps every task but the chief's there (<model_dir>/logs):"
        " give a --model_dir this user can write to."
      ) from e

  def start(self) -> None:
    """Starts every task, the chief first.

    Raises:
      LaunchError: the tasks' log folder cannot be written.
    """
    self._open_logs()
    # The tasks' lifeline: this process alone holds the write end, so its
    # end (however it dies) is the end of file a task's watcher waits for
    # where the kernel's parent-death signal is missing. That signal fires
    # when the thread that started the task ends: off the main thread, the
    # watcher is used instead.
    lifeline, self._lifeline = os.pipe()
    watchdog = threading.current_thread() is not threading.main_thread()
    try:
      for job, index in tasks(self.spec):
        self._start_task(job, index, lifeline, watchdog)
    finally:
      os.close(lifeline)

  def _start_task(
    self, job: str, index: int, lifeline: int, watchdog: bool
  ) -> None:
    env = dict(self.env)
    env["TF_CONFIG"] = json.dumps(
      {"cluster": self.spec, "task": {"type": job, "index": index}}
    )
    argv = launch_guard.argv(
      [*self.program, *self.command],
      parent=os.getpid(),
      lifeline=lifeline,
      grace_seconds=self.grace_seconds,
      watchdog=watchdog,
    )
    proc = subprocess.Popen(
      argv,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      bufsize=1,
      start_new_session=True,
      pass_fds=(lifeline,),
    )
    self.procs[(job, index)] = proc
    where = (
      "its lines below"
      if (job, index) == self.chief
      else f"output in {self.log_path(job, index)}"
    )
    self.print_line(
      f"[launch] {task_name(job, index)} pid {proc.pid} at "
      f"{self.spec[job][index]}: {where}"
    )
    self._tails[(job, index)] = collections.deque(maxlen=TAIL_LINES)
    thread = threading.Thread(
      target=self._pump, args=(job, index, proc), daemon=True
    )
    thread.start()
    self._threads[(job, index)] = thread

  def print_line(self, line: str) -> None:
    """Writes one line to the launcher's output, whole among the tasks'."""
    with self._lock:
      self.out.write(line.rstrip("\n") + "\n")
      self.out.flush()

  def _pump(self, job: str, index: int, proc: subprocess.Popen) -> None:
    prefix = f"[{task_name(job, index)}] "
    if (job, index) == self.chief:
      for line in proc.stdout or ():
        if not is_shutdown_noise(line):
          self.print_line(prefix + line)
      return
    tail = self._tails[(job, index)]
    with self._logs[(job, index)] as log:
      log.write(
        f"--- recsys launch {time.strftime('%Y-%m-%d %H:%M:%S')}: "
        f"{task_name(job, index)}, pid {proc.pid}: "
        f"{shlex.join(self.command)}\n"
      )
      log.flush()
      for line in proc.stdout or ():
        log.write(line)
        log.flush()
        tail.append(line)
        if is_error_line(line):
          self.print_line(prefix + line)

  def _report_exit(self, key: tuple[str, int], code: int, what: str) -> None:
    """Says a task exited, where its output is, and (an error) its last
    lines."""
    name = task_name(*key)
    self.print_line(f"[launch] {name} exited with status {code}; {what}")
    if code > 0:
      self._threads[key].join(timeout=5)  # its last lines read
      self.print_line(
        f"[launch] {name}'s last lines ({self.log_path(*key)} has them all):"
      )
      for line in self._tails.get(key, ()):
        self.print_line(f"[{name}] {line}")

  def wait(
    self,
    poll_seconds: float = 0.2,
    stopping: Callable[[], bool] = lambda: False,
  ) -> int | None:
    """Waits for the chief; stops early if a task it cannot lose fails.

    Args:
      poll_seconds: how often the tasks are looked at.
      stopping: returns True when the wait should end (a signal came).

    Returns:
      The chief's exit status, or that of the first task the cluster cannot
      lose that failed before it (a negative status: ended by that signal);
      None when `stopping()` came first.
    """
    chief = self.procs[self.chief]
    reported = set()
    while not stopping():
      code = chief.poll()
      if code is not None:
        self.print_line(
          f"[launch] {task_name(*self.chief)} exited with status {code}"
        )
        return code
      for key, proc in self.procs.items():
        code = proc.poll()
        if key == self.chief or code is None or key in reported:
          continue
        reported.add(key)
        job = key[0]
        if self.parameter_server_mode and job == "worker":
          self._report_exit(
            key, code, "the coordinator moves its work to the other workers"
          )
          continue
        if job == "worker" and code == 0:
          # A mirrored worker that finished its run; the chief follows.
          self.print_line(f"[launch] {task_name(*key)} finished (status 0)")
          continue
        self._report_exit(
          key,
          code,
          f"a {'parameter server' if job == 'ps' else 'mirrored worker'}"
          " cannot be lost: stopping the cluster",
        )
        return code
      time.sleep(poll_seconds)
    return None

  def settle(
    self,
    seconds: float = SETTLE_SECONDS,
    stopping: Callable[[], bool] = lambda: False,
  ) -> None:
    """Gives the tasks still running `seconds` to end by themselves: after
    a failure, the others may be failing for the same cause (`SETTLE_SECONDS`).
    """
    self._wait_for(self._running(), seconds, stopping)

  def statuses(self) -> dict[tuple[str, int], int | None]:
    """Every task's exit status (None: still running)."""
    return {key: proc.poll() for key, proc in self.procs.items()}

  def stop(
    self,
    grace_seconds: float | None = None,
    signum: int = signal.SIGTERM,
    hurry: Callable[[], bool] = lambda: False,
  ) -> None:
    """Ends every task, the chief first, and waits until each has ended.

    The chief gets `signum` and `grace_seconds` (default: the cluster's) to
    save a checkpoint and exit; every task still running then gets SIGTERM
    and `STOP_SECONDS`, then SIGKILL (as does every task's process group:
    a task's watcher, what a task started).

    Args:
      grace_seconds: the chief's time (None: `self.grace_seconds`).
      signum: what the chief gets: SIGTERM, or SIGINT for a Ctrl-C.
      hurry: returns True to skip the waits (Ctrl-C again).
    """
    if grace_seconds is None:
      grace_seconds = self.grace_seconds
    chief = self.procs.get(self.chief)
    if chief is not None and chief.poll() is None:
      _signal_group(chief, signum)
      self._wait_for([chief], grace_seconds, hurry)
      if chief.poll() is None:
        self.print_line(
          f"[launch] {task_name(*self.chief)} has not ended "
          f"{grace_seconds:g} s after {signal.Signals(signum).name}: every "
          f"task gets SIGTERM, and SIGKILL {STOP_SECONDS:g} s later"
        )
    running = self._running()
    for proc in running:
      _signal_group(proc, signal.SIGTERM)
    self._wait_for(running, STOP_SECONDS, hurry)
    if hurry() and self._running():
      self.print_line("[launch] Ctrl-C again: killing every task now")
    for proc in self.procs.values():
      _signal_group(proc, signal.SIGKILL)
    for proc in self.procs.values():
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.print_line(f"[launch] pid {proc.pid} did not exit after SIGKILL")
    if self._lifeline is not None:
      os.close(self._lifeline)
      self._lifeline = None
    for thread in self._threads.values():
      thread.join(timeout=5)

  def _running(self) -> list[subprocess.Popen]:
    return [proc for proc in self.procs.values() if proc.poll() is None]

  @staticmethod
  def _wait_for(
    procs: Iterable[subprocess.Popen],
    seconds: float,
    hurry: Callable[[], bool],
  ) -> None:
    """Until every one of `procs` has ended, `seconds` passed or `hurry()`."""
    deadline = time.monotonic() + seconds
    procs = list(procs)
    while time.monotonic() < deadline and not hurry():
      if all(proc.poll() is not None for proc in procs):
        return
      time.sleep(_STOP_POLL_SECONDS)


def cluster_status(ended: int, statuses: Iterable[int | None]) -> int:
  """The launcher's exit status for a cluster that ended with `ended`.

  Every task runs the same command, so a cause (a bad setting) often fails
  several; whichever reports it first, the status is the same:

  * 0: the chief's run succeeded;
  * 2 (`SETTINGS_EXIT_STATUS`): some task reported a settings error;
  * else `ended`, the chief's status or that of the first task the cluster
    could not lose; 1 if that task was ended by a signal (-9: SIGKILL).

  Args:
    ended: what `Cluster.wait` returned.
    statuses: every task's status once the cluster is stopped.
  """
  if ended == 0:
    return 0
  if SETTINGS_EXIT_STATUS in statuses:
    return SETTINGS_EXIT_STATUS
  return ended if ended > 0 else RUNTIME_EXIT_STATUS


def _is_failure(status: int) -> bool:
  """A status after which other tasks may yet report the cause."""
  return status not in (0, SETTINGS_EXIT_STATUS, *exits.STOPPED_BY_SIGNAL)


class StopSignals:
  """SIGTERM and SIGINT, recorded while active (a context manager).

  The handlers only record (a handler runs between two bytecodes of the main
  thread, maybe inside a lock it would need): `received` lists the signals
  in order; the launcher's loop acts on them. Outside the main thread
  (Python's rule for handlers) nothing is installed.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received: list[int] = []
    self._previous: dict[int, Any] = {}

  @property
  def first(self) -> int | None:
    """The first signal received, or None."""
    return self.received[0] if self.received else None

  def stopping(self) -> bool:
    return bool(self.received)

  def again(self) -> bool:
    """Ctrl-C after the first signal: stop without waiting (as the
    trainer aborts on a second Ctrl-C; a repeated SIGTERM only repeats)."""
    return signal.SIGINT in self.received[1:]

  def _handle(self, signum: int, frame: object) -> None:
    del frame
    self.received.append(signum)

  def __enter__(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: object) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()


def signal_status(signum: int) -> int:
  """The launcher's status after `signum`, as the shell reports a process
  stopped by it: 143 (SIGTERM), 130 (SIGINT; `recsys.process.exits`)."""
  if signum == signal.SIGINT:
    return exits.INTERRUPTED_EXIT_STATUS
  return exits.SIGTERM_EXIT_STATUS


def supervise(
  cluster: Cluster,
  grace_seconds: float | None = None,
  poll_seconds: float = 0.2,
) -> int:
  """Runs `cluster` until it ends, stops every task, returns the status.

  SIGTERM or SIGINT to this process (its main thread) is forwarded to the
  chief, which gets `grace_seconds` to save a checkpoint (`Cluster.stop`);
  the status is then 143 or 130, once every task has ended. Otherwise it is
  `cluster_status`'s.

  Raises:
    LaunchError: the cluster could not start (its tasks are stopped).
  """
  if grace_seconds is None:
    grace_seconds = cluster.grace_seconds
  ended: int | None = None
  with StopSignals() as signals:
    try:
      cluster.start()
      ended = cluster.wait(poll_seconds, stopping=signals.stopping)
      if ended is not None and _is_failure(ended):
        cluster.settle(SETTLE_SECONDS, stopping=signals.stopping)
    finally:
      if signals.first is not None:
        name = signal.Signals(signals.first).name
        chief = task_name(*cluster.chief)
        chief = "the chief" if chief == "chief" else f"the chief ({chief})"
        cluster.print_line(
          f"[launch] {name} received: stopping the cluster; {chief} has "
          f"{grace_seconds:g} s to save a checkpoint (Ctrl-C again: every "
          "task stops at once)"
        )
      cluster.stop(
        grace_seconds,
        signum=signals.first or signal.SIGTERM,
        hurry=signals.again,
      )
  if signals.first is not None:
    status = signal_status(signals.first)
    cluster.print_line(
      f"[launch] stopped on {signal.Signals(signals.first).name}: every task "
      f"has ended (status {status})"
    )
    return status
  assert ended is not None  # the wait ends with a status or a signal
  return cluster_status(ended, cluster.statuses().values())


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)  # each task leads its own session
  except (ProcessLookupError, PermissionError):
    pass


_LOOPBACK_ONLY = [
  "unshare",
  "-rn",
  "sh",
  "-c",
  'ip link set lo up && exec "$@"',
  "sh",
]


def _namespace_problem() -> str | None:
  """Why no loopback-only network namespace can be made here, or None."""
  if shutil.which("unshare") is None or shutil.which("ip") is None:
    return "the `unshare` and `ip` commands (util-linux, iproute2) are missing"
  try:
    probe = subprocess.run(
      [*_LOOPBACK_ONLY, "true"],
      capture_output=True,
      text=True,
      timeout=30,
      check=False,
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"`unshare -rn` failed: {e}"
  if probe.returncode != 0:
    return (
      f"`unshare -rn` failed ({probe.stderr.strip()[:200] or probe.returncode}"
      "): user namespaces may be disabled"
    )
  return None


def _private_network_argv(argv: Sequence[str]) -> list[str]:
  problem = _namespace_problem()
  if problem:
    raise LaunchError(
      f"cannot run the cluster on loopback only: {problem}. TensorFlow's "
      "gRPC servers listen on every interface and have no authentication "
      "(anyone who reaches a port can run ops in a task). Pass "
      "--listen_all_interfaces to run them that way on a trusted network."
    )
  return [*_LOOPBACK_ONLY, sys.executable, "-m", "recsys", "launch", *argv]


#: The time left for SIGKILLed tasks to be reaped, the end of the stop.
_KILL_SECONDS = 15.0


def run_owned(
  argv: Sequence[str],
  env: dict[str, str] | None = None,
  stop_seconds: float = 30.0,
  out: TextIO = sys.stdout,
  poll_seconds: float = 0.05,
) -> int:
  """Runs `argv` (the launcher inside the private network) as this
  process's own, and returns its status.

  It runs in a session of its own (a terminal's Ctrl-C reaches this process
  only), and every SIGTERM or SIGINT this process gets is forwarded to it
  once; it ends with this process (`recsys.launch_guard`), and is SIGKILLed
  if it has not ended `stop_seconds` after the first signal (its own tasks
  then get SIGTERM from the kernel).

  Returns:
    143 or 130 after a signal; else its status (1 if a signal killed it).
  """
  lifeline, keep = os.pipe()
  with StopSignals() as signals:
    try:
      proc = subprocess.Popen(
        launch_guard.argv(argv, os.getpid(), lifeline, stop_seconds),
        env=env,
        start_new_session=True,
        pass_fds=(lifeline,),
      )
    finally:
      os.close(lifeline)
    try:
      forwarded, deadline = 0, None
      while proc.poll() is None:
        for signum in signals.received[forwarded:]:
          os.kill(proc.pid, signum)
          forwarded += 1
          deadline = deadline or time.monotonic() + stop_seconds
        if deadline is not None and time.monotonic() > deadline:
          out.write(
            f"[launch] the cluster's launcher (pid {proc.pid}) has not "
            f"ended {stop_seconds:g} s after the signal: killing it\n"
          )
          out.flush()
          break
        time.sleep(poll_seconds)
    finally:
      _signal_group(proc, signal.SIGKILL)  # if running; a guard's watcher
      proc.wait()
      os.close(keep)
  if signals.first is not None:
    return signal_status(signals.first)
  if proc.returncode < 0:
    out.write(
      f"[launch] the cluster's launcher (pid {proc.pid}) was ended by "
      f"{signal.Signals(-proc.returncode).name}; its tasks got SIGTERM from "
      "the kernel and stop (their output is lost)\n"
    )
    out.flush()
    return RUNTIME_EXIT_STATUS
  return proc.returncode


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The flags of `recsys launch`."""
  parser.add_argument(
    "--workers", type=int, default=2, help="worker tasks (default 2)."
  )
  parser.add_argument(
    "--ps",
    type=int,
    default=2,
    help="parameter-server tasks (default 2); 0: a "
    "MultiWorkerMirroredStrategy cluster of the workers.",
  )
  parser.add_argument(
    "--grace_seconds",
    type=float,
    default=10.0,
    help="on SIGTERM or Ctrl-C (forwarded to the chief), how long "
    "the chief may take to save a checkpoint before every task still "
    f"running gets SIGTERM, then SIGKILL {STOP_SECONDS:g} s later "
    "(default 10).",
  )
  parser.add_argument(
    "--private_network",
    action="store_true",
    help="the default: run the cluster in a new network "
    "namespace with only a loopback interface (Linux, "
    "unshare -rn), as TF's servers listen on every "
    "interface without authentication.",
  )
  parser.add_argument(
    "--listen_all_interfaces",
    action="store_true",
    help="run the tasks without a private namespace: TF's "
    "gRPC servers then listen on every interface, with "
    "no authentication (trusted networks only, e.g. to "
    "reach them from other hosts).",
  )
  parser.add_argument(
    "task_command",
    nargs=argparse.REMAINDER,
    metavar="COMMAND",
    help="after `--`: the recsys command every task runs, e.g. "
    "train --gin_file F --model_dir D",
  )


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
  """Starts the cluster, waits for the chief, stops everything; its status.

  By default this process only runs the launcher again inside a private
  network namespace (`run_owned`), which starts and supervises the tasks
  (`supervise`).
  """
  command = list(args.task_command)
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    raise LaunchError(
      "give the command every task runs after `--`, e.g. "
      "recsys launch --workers 2 --ps 2 -- train --gin_file "
      "experiments/synthetic_dlrm.gin --model_dir runs/ps"
    )
  listen_all = getattr(args, "listen_all_interfaces", False)
  if listen_all and args.private_network:
    raise LaunchError(
      "--private_network and --listen_all_interfaces "
      "contradict each other; give one."
    )
  if not listen_all and not os.environ.get(_PRIVATE_ENV):
    argv = [
      f"--workers={args.workers}",
      f"--ps={args.ps}",
      f"--grace_seconds={args.grace_seconds}",
      "--",
      *command,
    ]
    env = dict(os.environ, **{_PRIVATE_ENV: "1"})
    return run_owned(
      _private_network_argv(argv),
      env=env,
      stop_seconds=args.grace_seconds + STOP_SECONDS + _KILL_SECONDS,
      out=out,
    )
  cluster = Cluster(
    cluster_spec(args.workers, args.ps),
    command,
    out=out,
    grace_seconds=args.grace_seconds,
  )
  return supervise(cluster)
