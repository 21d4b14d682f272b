"""Training examples/s: one process vs. a local parameter-server cluster.

Runs the same workload (the synthetic DLRM experiment, small tables, the
same batch and steps) twice through the real CLI:

  1. `recsys train`                                  (one process, tensorcore)
  2. `recsys launch --workers W --ps P -- train`      (chief + W workers + P ps,
                                                      sharded tables)

and prints each run's steady-state examples/s (the trainer's own figure,
first loop excluded: it traces the step) and eval AUC. All processes share
this machine's cores, so on a small machine this measures the cluster's
overhead (gRPC round trips, remote gathers and updates, the coordinator's
scheduling), not a speed-up; see the README's "Scaling out" section for the
paper estimate for many hosts.

Usage:
  python benchmarks/cluster_throughput.py                  # 2 workers, 2 ps
  python benchmarks/cluster_throughput.py --steps 600 --workers 1 --ps 1
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(steps: int, batch: int) -> list:
  return [
    "--gin_file",
    "experiments/synthetic_dlrm.gin",
    "--gin_file",
    "experiments/hardware/local_cluster.gin",
    "--gin_bindings",
    "SyntheticCTR.vocab_sizes = (50, 200, 1000, 30, 500)",
    "--gin_bindings",
    "SyntheticCTR.multi_hot_sizes = (1, 1, 1, 3, 1)",
    "--gin_bindings",
    "SyntheticCTR.num_dense = 5",
    "--gin_bindings",
    f"train.train_steps = {steps}",
    "--gin_bindings",
    f"train.steps_per_loop = {max(1, steps // 3)}",
    "--gin_bindings",
    f"train.global_batch_size = {batch}",
    "--gin_bindings",
    "train.checkpoint_every = 0",
    "--gin_bindings",
    "train.summaries = False",
    "--no_progress",
  ]


def _run(cmd: list, model_dir: str) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  start = time.time()
  proc = subprocess.run(
    cmd + ["--model_dir", model_dir],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
    check=False,
  )
  if proc.returncode:
    sys.exit(
      f"{' '.join(cmd[:6])} ... failed:\n{proc.stdout[-3000:]}"
      f"{proc.stderr[-3000:]}"
    )
  with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
    metrics = json.load(f)
  metrics["wall_seconds"] = time.time() - start
  return metrics


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--ps", type=int, default=2)
  args = parser.parse_args()
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    runs["1 process (tensorcore)"] = _run(
      [sys.executable, "-m", "recsys", "train", *_args(args.steps, args.batch)],
      os.path.join(tmp, "one"),
    )
    runs[f"chief + {args.workers} workers + {args.ps} ps (sharded)"] = _run(
      [
        sys.executable,
        "-m",
        "recsys",
        "launch",
        f"--workers={args.workers}",
        f"--ps={args.ps}",
        "--",
        "train",
        *_args(args.steps, args.batch),
      ],
      os.path.join(tmp, "cluster"),
    )
  print(
    f"{os.cpu_count()} CPU cores; {args.steps} steps of {args.batch} examples"
  )
  print(f"{'run':40s} {'examples/s':>11s} {'eval AUC':>9s} {'wall s':>7s}")
  for name, m in runs.items():
    print(
      f"{name:40s} {m['examples_per_second_steady']:11,.0f} {m['eval/auc']:9.4f} "
      f"{m['wall_seconds']:7.1f}"
    )


if __name__ == "__main__":
  main()
