"""The dynamic-vocabulary index's update step: ms per step, with eviction
active and without.

The workload: `--tables` tables (default 8), each with its own
`VocabularyIndex` of `--capacity` rows (200,000), fed `--batch` ids a step
(2048) drawn Zipf(`--zipf` 1.05) over `--raw_ids` raw ids (10**6, spread
over the int64 range), all tables' updates in one `tf.function`, as a
training step calls them (cross-replica, before the lookup). Each variant
runs `--warmup` steps, then reports the median, min and max wall ms per step
and the CPU ms per step (the process's user + system time) over `--steps`
steps:

  lru-room    eviction "lru", the table far from full: every new id takes a
              free row (the common step: no read of the R rows)
  lru-full    eviction "lru", the table filled beforehand with other ids:
              every step's new ids take victims (top_k over the R rows)
  none-full   eviction "none", full: new ids are refused, nothing evicted
  age-sweep   eviction "age" (max_age 20) sweeping every step: a read of
              the R rows every step (the rows filled beforehand are freed
              by the first sweep; victims only when the rows run out)

Each variant runs on each of `--paths`: "tf", the index's TF ops, and
"fused", its `RecsysVocabularyUpdate` op (the tensorcore backend's fused
CPU kernels, `backends/tensorcore/kernels/vocabulary_ops.cc`, built on
first use), which give identical results.

TF's threads are those `recsys train` chooses here (recsys.process.threads:
1 intra-op / 2 inter-op on 2 cores or fewer, else TF's defaults), or
`--intra_threads` / `--inter_threads`; the machine (CPU model, cores, load,
other busy processes) is printed before and after.

Example:
  python benchmarks/vocabulary_index.py
  python benchmarks/vocabulary_index.py --variants lru-full --steps 100
  python benchmarks/vocabulary_index.py --paths fused
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import race  # noqa: E402  (this folder: machine state)
import tables  # noqa: E402  (this folder: Markdown tables)

VARIANTS = ("lru-room", "lru-full", "none-full", "age-sweep")
PATHS = ("tf", "fused")


def zipf_batches(args, seed: int = 0) -> list[list[np.ndarray]]:
  """[step][table] int64 ids [batch]: Zipf ranks over the raw ids, each
  rank a fixed random int64 (the hot ids spread over the key space)."""
  rng = np.random.default_rng(seed)
  ranks = np.arange(1, args.raw_ids + 1, dtype=np.float64)
  cdf = np.cumsum(ranks**-args.zipf)
  cdf /= cdf[-1]
  steps = args.warmup + args.steps
  batches = [[] for _ in range(steps)]
  for _ in range(args.tables):
    raw = rng.integers(-(2**63), 2**63 - 1, args.raw_ids, dtype=np.int64)
    for step in range(steps):
      rank = np.searchsorted(cdf, rng.random(args.batch))
      batches[step].append(raw[np.minimum(rank, args.raw_ids - 1)])
  return batches


def run_variant(variant: str, path: str, batches, args) -> dict:
  import tensorflow as tf

  from backends.vocabulary import DynamicVocabulary, VocabularyIndex

  eviction = variant.split("-")[0]
  age = {"max_age": 20} if eviction == "age" else {}
  policy = DynamicVocabulary(eviction=eviction, **age)
  ops = fused_ops() if path == "fused" else None
  indexes = [
    VocabularyIndex(f"t{t}", args.capacity, policy, fused_ops=ops)
    for t in range(args.tables)
  ]
  if variant != "lru-room":
    # Full of ids the stream never holds (they are all in [0, capacity),
    # the stream's are random int64s), seen long ago.
    fill = tf.range(args.capacity, dtype=tf.int64)
    for index in indexes:
      index.update(fill, tf.constant(-100, tf.int64))

  signature = [tf.TensorSpec([None], tf.int64)] * args.tables
  signature.append(tf.TensorSpec([], tf.int64))

  @tf.function(input_signature=signature)
  def step(*inputs):
    *ids, step_number = inputs
    return [
      tf.size(index.update(i, step_number).reset_rows)
      for index, i in zip(indexes, ids)
    ]

  wall, cpu, admitted = [], [], 0
  for number, batch in enumerate(batches):
    inputs = [tf.constant(b) for b in batch]
    start, start_cpu = time.perf_counter(), time.process_time()
    sizes = step(*inputs, tf.constant(number, tf.int64))
    sizes = [int(s) for s in sizes]  # waits for the step
    if number >= args.warmup:
      wall.append(time.perf_counter() - start)
      cpu.append(time.process_time() - start_cpu)
      admitted += sum(sizes)
  counters = indexes[0].counters()
  return {
    "variant": variant,
    "path": path,
    "median_ms": 1000 * statistics.median(wall),
    "min_ms": 1000 * min(wall),
    "max_ms": 1000 * max(wall),
    "cpu_ms": 1000 * statistics.median(cpu),
    "new_rows_per_table_step": admitted / len(wall) / args.tables,
    "evictions_table0": int(counters["evictions"]),
    "rows_in_use_table0": int(counters["rows_in_use"]),
  }


def fused_ops():
  """The loaded fused CPU kernels; exits saying why when there are none."""
  from backends.tensorcore import kernels

  ops = kernels.load()
  if ops is None:
    sys.exit(
      "--paths fused: the fused CPU kernels are unavailable here (see the "
      "log above; RECSYS_FUSED_KERNELS=0 switches them off)."
    )
  return ops


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--tables", type=int, default=8)
  parser.add_argument("--batch", type=int, default=2048)
  parser.add_argument("--raw_ids", type=int, default=1_000_000)
  parser.add_argument("--capacity", type=int, default=200_000)
  parser.add_argument("--zipf", type=float, default=1.05)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument(
    "--paths",
    default=",".join(PATHS),
    help="the update's implementations to run: tf (the TF ops), fused "
    "(RecsysVocabularyUpdate)",
  )
  parser.add_argument("--intra_threads", type=int, default=0)
  parser.add_argument("--inter_threads", type=int, default=0)
  parser.add_argument("--json", default="", help="also write the rows here")
  args = parser.parse_args(argv)
  variants = [v for v in args.variants.split(",") if v]
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    parser.error(f"unknown --variants {unknown}; choose from {VARIANTS}")
  paths = [p for p in args.paths.split(",") if p]
  unknown = sorted(set(paths) - set(PATHS))
  if unknown:
    parser.error(f"unknown --paths {unknown}; choose from {PATHS}")

  from recsys.process import threads as threads_lib

  intra, inter, _ = threads_lib.thread_settings(
    args.intra_threads, args.inter_threads, threads_lib.available_cores()
  )
  import tensorflow as tf

  if intra:
    tf.config.threading.set_intra_op_parallelism_threads(intra)
  if inter:
    tf.config.threading.set_inter_op_parallelism_threads(inter)
  settings = {
    "machine": f"{race.cpu_model()}, {platform.machine()}, "
    f"{os.cpu_count()} cpus, Python {platform.python_version()}, "
    f"TF {tf.__version__}",
    "threads (intra-op / inter-op)": f"{intra or 'default'} / "
    f"{inter or 'default'}",
    **{
      k: v
      for k, v in vars(args).items()
      if k not in ("json", "variants", "paths")
    },
  }
  print("settings: " + json.dumps(settings))
  print(race.machine_state("before"), flush=True)
  batches = zipf_batches(args)
  rows = [run_variant(v, p, batches, args) for v in variants for p in paths]
  print(race.machine_state("after"))
  tables.print_table(
    "variant | path | median ms/step | min | max | CPU ms/step | "
    "new rows/table/step | table 0: evictions, rows in use",
    (
      f"{r['variant']} | {r['path']} | {r['median_ms']:.2f} | "
      f"{r['min_ms']:.2f} | "
      f"{r['max_ms']:.2f} | {r['cpu_ms']:.2f} | "
      f"{r['new_rows_per_table_step']:.0f} | {r['evictions_table0']}, "
      f"{r['rows_in_use_table0']}"
      for r in rows
    ),
  )
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"settings": settings, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
