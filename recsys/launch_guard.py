"""Runs one process of `recsys launch` so that it ends with the launcher.

The launcher starts each of its processes (the cluster's tasks; the
launcher inside the private network namespace) as

  python -I launch_guard.py --parent PID --lifeline FD --grace S -- PROGRAM...

and this script then becomes PROGRAM (exec: the same pid and parent) once
it is sure PROGRAM stops if the launcher dies, even by SIGKILL, which the
launcher cannot handle:

* on Linux by the kernel's parent-death signal (`prctl(PR_SET_PDEATHSIG)`):
  SIGTERM when the launcher's thread that started it ends, which a trainer
  answers by saving a checkpoint and exiting 143, and a launcher by
  stopping its own tasks in order;
* elsewhere, or with `--watchdog` (the launcher asks for it when it starts
  processes from a thread other than its main one, whose end would fire the
  kernel's signal early), by a watcher: a small process, PROGRAM's child,
  that holds the read end of a pipe whose write end only the launcher
  holds (`--lifeline`); its end of file is the launcher's death. It then
  sends PROGRAM SIGTERM, and SIGKILL after `--grace` seconds. It ends when
  PROGRAM ends.

Standard library only, and run with `-I`: it runs before, and without,
recsys and the user's Python environment (PROGRAM gets both back).
"""

import argparse
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Sequence

#: prctl's option to set the calling process's parent-death signal.
PR_SET_PDEATHSIG = 1
#: How often the watcher looks whether PROGRAM has ended.
POLL_SECONDS = 0.2
#: The status when the launcher ended before PROGRAM could start: as if
#: PROGRAM had been stopped by SIGTERM (128 + 15), what it would have got.
GONE_STATUS = 128 + signal.SIGTERM


def argv(
  program: Sequence[str],
  parent: int,
  lifeline: int,
  grace_seconds: float,
  watchdog: bool = False,
) -> list[str]:
  """The command line that runs `program` under this guard.

  Args:
    program: what to run (e.g. `[python, -m, recsys, train, ...]`).
    parent: the launcher's pid: `program`'s parent.
    lifeline: the read end of a pipe whose write end only the launcher
      holds (pass it to the child: `subprocess.Popen(pass_fds=...)`).
    grace_seconds: the watcher's time between SIGTERM and SIGKILL.
    watchdog: use the watcher even where the kernel's signal is available.
  """
  return [
    sys.executable,
    "-I",
    os.path.abspath(__file__),
    f"--parent={parent}",
    f"--lifeline={lifeline}",
    f"--grace={grace_seconds}",
    *(["--watchdog"] if watchdog else []),
    "--",
    *program,
  ]


def set_parent_death_signal(sig: int) -> bool:
  """Asks the kernel to send this process `sig` when its parent ends.

  Returns:
    False where that cannot be asked (not Linux, no `prctl`).
  """
  if not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
  except (OSError, AttributeError):
    return False


def watch(lifeline: int, program_pid: int, grace_seconds: float) -> None:
  """The watcher: PROGRAM's child, until PROGRAM or the launcher ends.

  It takes no part in what is meant for PROGRAM: the launcher signals
  PROGRAM's whole process group (this process is in it), so SIGTERM and
  SIGINT are ignored here, and it holds none of PROGRAM's output pipes.
  """
  for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
  devnull = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(devnull, fd)
  while os.getppid() == program_pid:  # else PROGRAM has ended
    ready, _, _ = select.select([lifeline], [], [], POLL_SECONDS)
    if ready:  # end of file: the launcher is gone (nobody writes to it)
      _stop(program_pid, grace_seconds)
      return


def _stop(program_pid: int, grace_seconds: float) -> None:
  """SIGTERM to PROGRAM (this process's parent), SIGKILL after the grace."""
  try:
    os.kill(program_pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while os.getppid() == program_pid and time.monotonic() < deadline:
      time.sleep(POLL_SECONDS / 4)
    if os.getppid() == program_pid:
      os.kill(program_pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def main(args: Sequence[str] | None = None) -> int:
  """Arranges PROGRAM's end with the launcher, then becomes PROGRAM."""
  parser = argparse.ArgumentParser(prog="launch_guard", description=__doc__)
  parser.add_argument("--parent", type=int, required=True)
  parser.add_argument("--lifeline", type=int, required=True)
  parser.add_argument("--grace", type=float, default=10.0)
  parser.add_argument("--watchdog", action="store_true")
  parser.add_argument("program", nargs=argparse.REMAINDER)
  parsed = parser.parse_args(args)
  program = parsed.program[1:] if parsed.program[:1] == ["--"] else []
  if not program:
    parser.error("give the program to run after `--`")
  if parsed.watchdog or not set_parent_death_signal(signal.SIGTERM):
    program_pid = os.getpid()
    if os.fork() == 0:
      try:
        watch(parsed.lifeline, program_pid, parsed.grace)
      finally:
        os._exit(0)
  os.close(parsed.lifeline)  # the watcher's; PROGRAM holds no copy
  if os.getppid() != parsed.parent:
    print(
      f"launch_guard: the launcher (pid {parsed.parent}) ended before "
      f"{program[0]} could start; not starting it.",
      file=sys.stderr,
    )
    return GONE_STATUS
  sys.stdout.flush()
  try:
    os.execvp(program[0], program)
  except OSError as e:
    print(f"launch_guard: cannot run {program[0]}: {e}", file=sys.stderr)
    return 127
  return 0  # not reached: exec replaced this process


if __name__ == "__main__":
  sys.exit(main())
