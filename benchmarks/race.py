"""A fair race: the machine's state, and each rival at its best setting.

Shared by `embedding_step.py` and `dlrm_vs_torchrec.py` (issue 46). A
rival's thread count can decide a race on a small machine: an independent
harness found TorchRec's DLRM step 2.4x faster on one torch thread than on
two of this project's 2 cores, where the scripts had run it on two. So the
scripts sweep each rival's thread settings, report every setting's figure,
and take every ratio against the rival's best one.

A shared machine moves wall times by tens of percent, so the header says
what the machine is, how loaded it was and which other processes used its
cores (sampled over a second, not ps's lifetime averages), before and after
the runs. `spinning(n)` makes such a machine on demand: n processes each
keeping a core busy beside a measured run.

Standard library only: the torch children (their own venv) import this
module's siblings too.
"""

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def thread_counts(text: str) -> list[int]:
  """`--torch_threads`-style lists: "1,2" -> [1, 2]."""
  return [int(t) for t in str(text).split(",") if t.strip()]


def cpu_model() -> str:
  """/proc/cpuinfo's model name (the printed CPU; the docs once said Intel
  on an AMD machine)."""
  try:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown CPU"


def load_average() -> tuple[float, float, float]:
  """The 1, 5 and 15 minute load averages (0s where /proc is absent)."""
  try:
    with open("/proc/loadavg", encoding="ascii") as f:
      one, five, fifteen = f.read().split()[:3]
    return float(one), float(five), float(fifteen)
  except OSError:
    return 0.0, 0.0, 0.0


def _cpu_ticks() -> dict[int, tuple[int, str]]:
  """{pid: (user + system clock ticks so far, command line)}."""
  ticks = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
        stat = f.read()
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:  # the process ended meanwhile
      continue
    # Fields after the parenthesised name: state is the 3rd field, utime and
    # stime the 14th and 15th.
    fields = stat.rsplit(")", 1)[1].split()
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    ticks[int(entry)] = (int(fields[11]) + int(fields[12]), cmd or f"[{name}]")
  return ticks


def busy_processes(
  seconds: float = 1.0, min_share: float = 0.05, width: int = 100
) -> list[tuple[int, float, str]]:
  """(pid, cores used, command) of processes busier than `min_share` of a
  core over the next `seconds`, busiest first (this process excluded)."""
  if not os.path.isdir("/proc"):
    return []
  hz = os.sysconf("SC_CLK_TCK")
  before = _cpu_ticks()
  time.sleep(seconds)
  after = _cpu_ticks()
  busy = []
  for pid, (ticks, cmd) in after.items():
    if pid == os.getpid() or pid not in before:
      continue
    share = (ticks - before[pid][0]) / hz / seconds
    if share >= min_share:
      busy.append((pid, share, cmd[:width]))
  return sorted(busy, key=lambda b: -b[1])


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
  """`count` other processes each keeping one core busy (a pure-Python
  spin) while the block runs: the shared machine of issue 46, on demand."""
  spinners = [
    subprocess.Popen(
      [sys.executable, "-c", "while True: pass"],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    for _ in range(count)
  ]
  try:
    if spinners:
      time.sleep(0.5)  # under way before the measured run starts
    yield
  finally:
    for spinner in spinners:
      spinner.kill()
      spinner.wait()


def machine_state(label: str) -> str:
  """Lines for the header (`label`: "before" / "after"): CPU, cores, load,
  the other busy processes."""
  one, five, fifteen = load_average()
  lines = [
    f"machine {label}: {cpu_model()}, {os.cpu_count()} cpus; load average "
    f"{one:.2f} {five:.2f} {fifteen:.2f}"
  ]
  busy = busy_processes()
  if not busy:
    lines.append("  no other process used more than 5 % of a core")
  for pid, share, cmd in busy:
    lines.append(f"  busy: pid {pid} {share * 100:.0f} % of a core: {cmd}")
  return "\n".join(lines)


def best(rows: Iterable[dict[str, Any]], key: str) -> dict[str, Any] | None:
  """The row with the highest `key` (None when there is none)."""
  rows = list(rows)
  return max(rows, key=lambda r: r[key]) if rows else None


def mark_best(
  rows: Sequence[dict[str, Any]],
  group: Callable[[dict[str, Any]], Any],
  key: str,
) -> dict[Any, dict[str, Any]]:
  """Per group of rows (one implementation at one point, all its thread
  settings): its best row by `key`. Sets each row's `best` (True for that
  row) and `of_best` (its `key` over the best one's); returns {group: row}."""
  groups: dict[Any, list[dict[str, Any]]] = {}
  for row in rows:
    groups.setdefault(group(row), []).append(row)
  winners = {}
  for name, members in groups.items():
    top = best(members, key)
    assert top is not None
    for row in members:
      row["best"] = row is top
      row["of_best"] = row[key] / top[key]
    winners[name] = top
  return winners
