"""Peak RSS per process and phase: one big table, replicated vs row-sharded.

Trains the default DLRM (`experiments/synthetic_dlrm.gin`) with one table
grown to `--rows` x 16 (Adam: the table and two slots) with `recsys train`
in one process (every table replicated) and with `recsys launch --ps 0
--workers N` for each N of `--workers` (the planner row-shards under a
per-device budget that only N shards meet), then restarts each run for a
few more steps so it restores. Each process logs its peak RSS per phase
(`recsys.training.memory_peaks`: init, restore, train, save, evaluate);
this prints them per worker with the shard each one holds.

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


def _bindings(rows: int, steps: int, budget: int | None) -> list[str]:
  vocab = f"(1000, 200, 5000, {rows}, 100, 3000, 800, 2000)"
  out = [
    f"SyntheticCTR.vocab_sizes = {vocab}",
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
  args = parser.parse_args(argv)
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
  print("| run | process | holds | init | restore | train | save | evaluate |")
  print("|---|---|---|---|---|---|---|---|")
  runs = [(0, None)]
  for workers in (int(w) for w in args.workers.split(",") if w):
    # A device budget (80% of it) that only `workers` shards meet.
    runs.append((workers, int((table / workers + others) / 0.8 * 1.05)))
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
      cells = [
        f"{a.get('init', 0):.0f}",
        f"{b.get('restore', 0):.0f}",
        f"{max(a.get('train', 0), b.get('train', 0)):.0f}",
        f"{max(a.get('save', 0), b.get('save', 0)):.0f}",
        f"{max(a.get('evaluate', 0), b.get('evaluate', 0)):.0f}",
      ]
      print(
        f"| {label} | {worker} | {holds:.0f} MiB | " + " | ".join(cells) + " |"
      )


if __name__ == "__main__":
  main()
