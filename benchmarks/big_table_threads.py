"""One big table on 1 vs 2 intra-op threads, interleaved step by step.

By default the fused kernels split a large call over the intra-op threads
that the step's other tables leave idle
(backends/tensorcore/kernels/embedding_ops.cc): a step of one table gets them
all. This measures what that buys on `embedding_step.py`'s step with one table
(default 10^7 x 32, batch 16384): several long-lived child processes, one per
setting, each holding its own table, take turns running `--burst` steps, so a
machine shared with other work slows them alike (finer interleaving than
`embedding_step.py
--intra_threads 1,2`, whose children each build a 10^7-row table for one
measurement).

Settings: `1-core` (one intra-op thread, the process pinned to one core
with `taskset -c 0`: the one-core baseline), `1` (one intra-op thread; the
two inter-op threads still run independent ops side by side), `2-off` (two
intra-op threads for TF's own ops, every kernel call on one thread:
RECSYS_KERNEL_PARALLEL_MIN_WORK=off), `2` (two, the kernels split as they
decide: the default). Reports per setting
the median step time, M ids/s, median CPU ms per step and the ratio to the
first setting.

    python benchmarks/big_table_threads.py --rows 10000000 --batch 16384
    --rounds 15
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embedding_step  # noqa: E402  (this folder)

SETTINGS = ("1-core", "1", "2-off", "2")
_OFF = {"RECSYS_KERNEL_PARALLEL_MIN_WORK": "off"}


def child(args) -> None:
  """Builds the step, then runs `N` steps per line read; prints the times."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  step, prepare = embedding_step.tf_step_with_threads("recsys", args)
  batches = embedding_step.make_batches(
    args.distinct_batches,
    args.batch,
    1,
    args.rows,
    args.max_bag,
    args.zipf,
    args.seed,
  )
  ids = float(np.mean([len(b["f0"][0]) for b in batches]))
  inputs = [prepare(b) for b in batches]
  labels = [
    tf.constant(l)
    for l in embedding_step.make_labels(len(batches), args.batch, args.seed)
  ]
  i = 0
  for _ in range(3):  # trace and warm up
    step(inputs[i % len(inputs)], labels[i % len(inputs)]).numpy()
    i += 1
  print(json.dumps({"ready": True, "ids_per_step": ids}), flush=True)
  for line in sys.stdin:
    wall, cpu = [], []
    for _ in range(int(line)):
      start, start_cpu = time.perf_counter(), time.process_time()
      step(inputs[i % len(inputs)], labels[i % len(inputs)]).numpy()
      wall.append(time.perf_counter() - start)
      cpu.append(time.process_time() - start_cpu)
      i += 1
    print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--settings", default=",".join(SETTINGS))
  parser.add_argument("--rows", type=int, default=10_000_000)
  parser.add_argument("--batch", type=int, default=16384)
  embedding_step.add_step_arguments(
    parser,
    distinct_batches=4,
    table_dtype_help="the table's storage (tensorcore's table_dtype)",
  )
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--burst", type=int, default=3, help="steps per turn")
  parser.add_argument("--inter_threads", type=int, default=2)
  parser.add_argument("--intra_threads", type=int, default=2)
  parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.features, args.bag_width = 1, 0
  if args._child:  # pylint: disable=protected-access
    child(args)
    return

  flags = [
    f"--{k}={getattr(args, k)}"
    for k in (
      "rows",
      "batch",
      "dim",
      "max_bag",
      "zipf",
      "lr",
      "seed",
      "distinct_batches",
      "inter_threads",
      "table_dtype",
    )
  ]
  procs, ids = {}, 0.0
  settings = args.settings.split(",")
  for s in settings:
    intra = int(s.split("-")[0])
    env = dict(
      os.environ,
      **embedding_step.thread_env(args, intra),
      **(_OFF if s.endswith("-off") else {}),
    )
    if not s.endswith("-off"):  # the kernels' default, whatever is set here
      env.pop("RECSYS_KERNEL_PARALLEL_MIN_WORK", None)
    pin = ["taskset", "-c", "0"] if s.endswith("-core") else []
    procs[s] = subprocess.Popen(
      pin
      + [
        sys.executable,
        os.path.abspath(__file__),
        "--_child",
        f"--intra_threads={intra}",
      ]
      + flags,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=env,
    )
    ids = json.loads(procs[s].stdout.readline())["ids_per_step"]
  print(
    f"one table {args.rows} x {args.dim}, batch {args.batch}, "
    f"{ids:.0f} ids/step; {args.rounds} rounds x {args.burst} steps per "
    f"setting, interleaved; threads: {embedding_step.thread_env(args, 1)} "
    "with OMP/MKL/TF intra set to each setting's count"
  )
  times = {s: {"wall": [], "cpu": []} for s in settings}
  for _ in range(args.rounds):
    for s in settings:
      procs[s].stdin.write(f"{args.burst}\n")
      procs[s].stdin.flush()
      got = json.loads(procs[s].stdout.readline())
      times[s]["wall"] += got["wall"]
      times[s]["cpu"] += got["cpu"]
  for p in procs.values():
    p.stdin.close()
    p.wait()
  base = None
  print("| setting | step ms | M ids/s | CPU ms/step | vs first |")
  print("|---|---|---|---|---|")
  for s in settings:
    wall = statistics.median(times[s]["wall"])
    cpu = statistics.median(times[s]["cpu"])
    base = base or wall
    print(
      f"| {s} | {wall * 1e3:.1f} | {ids / wall / 1e6:.2f} | "
      f"{cpu * 1e3:.1f} | {base / wall:.2f}x |"
    )


if __name__ == "__main__":
  main()
