"""Peak RSS per process and phase: one big table, replicated vs row-sharded.

Trains the default DLRM (`experiments/synthetic_dlrm.gin`) with one table
grown to `--rows` x 16 (Adam: the table and two slots) with `recsys train`
in one process (every table replicated) and with `recsys launch --ps 0
--workers N` for each N of `--workers` (the planner row-shards under a
per-device budget that only N shards meet), then restarts each run for a
few more steps so it restores. Each process logs its peak RSS per phase
(`recsys.run.memory_peaks`: init, restore, train, save, evaluate);
this prints them per worker (MiB) with the tables and slots each one holds:
the first run's phases and its peak, then the restarted run's restore and
its peak (a process's RSS keeps what its allocator freed, so a phase shows
at least what the phases before it left resident).

    python benchmarks/sharded_memory.py [--rows 4000000] [--workers 2,4] \\
        [--steps 40] [--more_steps 10]

One process at a time runs its phases (the workers of a cluster in
parallel): run it with nothing else on the machine.
"""

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PEAK = re.compile(
  r"^(?:\[worker (\d+)\] )?.*peak RSS of this process: (.*)$", re.M
)
_PHASE = re.compile(r"(\w+) ([\d.]+) (KiB|MiB|GiB)")
_UNIT = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
GLOBAL_BATCH = 1024


def _bindings(rows: int, steps: int, budget: int | None) -> list[str]:
  vocab = f"(1000, 200, 5000, {rows}, 100, 3000, 800, 2000)"
  out = [
    f"SyntheticCTR.vocab_sizes = {vocab}",
    f"train.global_batch_size = {GLOBAL_BATCH}",
    f"train.train_steps = {steps}",
    f"train.steps_per_loop = {steps}",
    f"train.checkpoint_every = {steps}",
    "train.eval_steps = 4",
    "train.summaries = False",
  ]
  if budget is not None:
    out += [
      "train.placement = @EmbeddingPlacement()",
      f"EmbeddingPlacement.device_memory = {budget}",
    ]
  return out


def _command(model_dir: str, bindings: list[str], workers: int) -> list[str]:
  train = ["train", "--gin_file", "experiments/synthetic_dlrm.gin"]
  train += ["--model_dir", model_dir, "--no_progress"]
  train += ["--verbosity", "info"]  # the peak RSS lines `_peaks` reads
  for binding in bindings:
    train += ["--gin_bindings", binding]
  if workers == 0:
    return [sys.executable, "-m", "recsys", *train]
  launch = [sys.executable, "-m", "recsys", "launch", "--ps", "0"]
  return launch + ["--workers", str(workers), "--", *train]


def _peaks(output: str) -> dict[str, dict[str, float]]:
  """worker -> phase -> peak MiB, from the processes' log lines."""
  out = {}
  for worker, phases in _PEAK.findall(output):
    out[worker or "0"] = {
      name: float(value) * _UNIT[unit]
      for name, value, unit in _PHASE.findall(phases)
    }
  return out


def _run(label: str, cmd: list[str]) -> dict[str, dict[str, float]]:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False
  )
  output = proc.stdout + proc.stderr
  if proc.returncode != 0:
    sys.exit(f"{label}: exit {proc.returncode}\n{output[-4000:]}")
  return _peaks(output)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rows", type=int, default=4_000_000)
  parser.add_argument("--workers", default="2")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--more_steps", type=int, default=10)
  parser.add_argument(
    "--device_memory",
    type=int,
    default=0,
    help="the per-device memory the planner plans the workers' runs with "
    "(0: one that only N shards of the big table meet); e.g. a quarter of "
    "the big table with its slots, for a table 4x a device's memory",
  )
  parser.add_argument(
    "--serve",
    action="store_true",
    help="then `recsys evaluate` the last cluster's checkpoint in one "
    "process (tables replicated) and `recsys export` it (TF's "
    "TPUEmbeddingForServing), with their peak RSS",
  )
  parser.add_argument("--skip_one_process", action="store_true")
  parser.add_argument(
    "--global_batch", type=int, default=1024, help="a multiple of --workers"
  )
  args = parser.parse_args(argv)
  global GLOBAL_BATCH
  GLOBAL_BATCH = args.global_batch
  table = args.rows * 16 * 4 * 3  # table + Adam's two slots, float32
  others = (1000 + 200 + 5000 + 100 + 3000 + 800 + 2000) * 16 * 4 * 3
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
      cpu = next(
        line.split(":", 1)[1].strip() for line in f if "model name" in line
      )
  except (OSError, StopIteration):
    pass
  print(
    f"{cpu}, {os.cpu_count()} cores; table {args.rows} x 16 with Adam: "
    f"{table / 2**20:.0f} MiB (the other 7 tables {others / 2**20:.1f} MiB); "
    f"{args.steps} steps, a save, then {args.more_steps} more after a restore"
  )
  print(
    "| run | process | holds | init | train | save | evaluate | peak "
    "| restart: restore | restart: peak |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  runs = [] if args.skip_one_process else [(0, None)]
  for workers in (int(w) for w in args.workers.split(",") if w):
    # A device budget (80% of it) that only `workers` shards meet.
    budget = args.device_memory or int((table / workers + others) / 0.8 * 1.05)
    runs.append((workers, budget))
  if args.device_memory:
    print(
      f"device memory {args.device_memory / 2**20:.0f} MiB (budget "
      f"{0.8 * args.device_memory / 2**20:.0f} MiB): the big table with "
      f"its slots is {table / args.device_memory:.1f}x a device's memory"
    )
  for workers, budget in runs:
    label = (
      "1 process, replicated"
      if not workers
      else f"{workers} workers, row-sharded"
    )
    model_dir = tempfile.mkdtemp(prefix="sharded_memory_")
    first = _run(
      label,
      _command(model_dir, _bindings(args.rows, args.steps, budget), workers),
    )
    total = args.steps + args.more_steps
    second = _run(
      label,
      _command(model_dir, _bindings(args.rows, total, budget), workers),
    )
    holds = (table / max(1, workers) + others) / 2**20
    for worker in sorted(first):
      a, b = first[worker], second.get(worker, {})
      cells = [f"{a.get(p, 0):.0f}" for p in ("init", "train", "save")]
      cells += [
        f"{a.get('evaluate', 0):.0f}",
        f"**{max(a.values()):.0f}**",
        f"{b.get('restore', 0):.0f}",
        f"{max(b.values(), default=0):.0f}",
      ]
      print(
        f"| {label} | {worker} | {holds:.0f} MiB | " + " | ".join(cells) + " |"
      )
  if args.serve and runs and runs[-1][0]:
    _serve(model_dir, args.rows, total)


def _serve(model_dir: str, rows: int, steps: int) -> None:
  """The cluster's checkpoint in one process: evaluated, then exported."""
  # One device (this host) with a budget the whole table fits.
  bindings = _bindings(rows, steps, 8 << 30)
  evaluate = [sys.executable, "-m", "recsys", "evaluate"]
  evaluate += ["--model_dir", model_dir]
  for binding in bindings:
    evaluate += ["--gin_bindings", binding]
  export = [sys.executable, "-m", "recsys", "export", "--model_dir", model_dir]
  export += ["--export_dir", os.path.join(model_dir, "export")]
  for name, cmd in (("evaluate", evaluate), ("export", export)):
    peak = _timed_peak(cmd)
    print(
      f"recsys {name} of the cluster's checkpoint, 1 process: peak RSS "
      f"{peak:.0f} MiB"
    )


def _timed_peak(cmd: list[str]) -> float:
  """Peak RSS (MiB) of one child process (its own wrapper's rusage)."""
  wrapper = (
    "import resource, subprocess, sys;"
    "code = subprocess.run(sys.argv[1:]).returncode;"
    "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN)"
    ".ru_maxrss);"
    "sys.exit(code)"
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    [sys.executable, "-c", wrapper, *cmd],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  if proc.returncode != 0:
    sys.exit(f"{cmd[3]}: exit {proc.returncode}\n{proc.stdout[-3000:]}")
  kib = re.search(r"MAXRSS_KIB (\d+)", proc.stdout)
  return int(kib.group(1)) / 1024 if kib else float("nan")


if __name__ == "__main__":
  main()
