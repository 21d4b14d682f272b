"""Embedding training-step throughput: recsys backends vs. other implementations.

The standard workload (issue "Performance"): 8 categorical features, each with
its own table of 200,000 x 32; multi-hot bags of 1-8 ids (uniform length),
Zipf-skewed ids (s = 1.05, fixed seed); sum combiner; batch 2048; a tiny dense
head (concat -> Dense(1)) with binary cross-entropy on random labels; Adagrad
lr 0.05 on the tables. One step = forward + backward + embedding update.

Each implementation runs in its own subprocess (clean peak RSS, no shared
caches), implementations interleaved over `--repeats` rounds; the table
reports medians of the per-run median step time, ids/s and the ratio to the
first implementation.

    OMP_NUM_THREADS=2 python benchmarks/embedding_step.py
    python benchmarks/embedding_step.py --impls tensorcore,keras_embedding --rows 10000,1000000
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

IMPLS = ("tensorcore", "tensorcore_padded", "keras_embedding", "tf_sparse_fused")


def make_batches(num_batches: int, batch: int, features: int, rows: int,
                 max_bag: int, zipf: float, seed: int) -> List[Dict[str, tuple]]:
  """Pre-generated batches: per feature (values, row_lengths) int64 arrays."""
  rng = np.random.default_rng(seed)
  ranks = np.arange(1, rows + 1, dtype=np.float64)
  cdf = np.cumsum(ranks ** -zipf)
  cdf /= cdf[-1]
  permutation = rng.permutation(rows)  # hot ids spread over the table
  batches = []
  for _ in range(num_batches):
    feats = {}
    for f in range(features):
      lengths = rng.integers(1, max_bag + 1, size=batch)
      ids = permutation[np.searchsorted(cdf, rng.random(lengths.sum()))]
      feats[f"f{f}"] = (ids.astype(np.int64), lengths.astype(np.int64))
    batches.append(feats)
  return batches


def _ragged(batch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {k: tf.RaggedTensor.from_row_lengths(v, l) for k, (v, l) in batch.items()}


def build_step(impl: str, args):
  """Returns step(features_dict, labels), or (step, prepare_inputs)."""
  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import backends  # pylint: disable=g-import-not-at-top

  E = tf.tpu.experimental.embedding
  names = [f"f{i}" for i in range(args.features)]
  head = tf.keras.layers.Dense(1)
  head.build([None, args.features * args.dim])
  head_opt = tf.keras.optimizers.SGD(0.01)
  bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)

  if impl.startswith("tensorcore"):
    tables = {n: E.TableConfig(args.rows, args.dim, combiner="sum", name=n)
              for n in names}
    config = {n: E.FeatureConfig(tables[n]) for n in names}
    emb = backends.TensorCoreEmbedding(
        config, E.Adagrad(args.lr),
        bag_widths=args.max_bag if impl == "tensorcore_padded" else None)
    emb.build()

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = emb.lookup(features, training=True)
        tape.watch(acts)
        logits = head(tf.concat([acts[n] for n in names], axis=1))
        loss = bce(labels, logits)
      dense_grads, act_grads = tape.gradient(loss, (head.trainable_variables, acts))
      head_opt.apply_gradients(zip(dense_grads, head.trainable_variables))
      emb.apply_gradients(act_grads)
      return loss

    if impl == "tensorcore_padded":
      # preprocess() belongs to the input pipeline: padded once, not timed.
      return step, lambda f: emb.preprocess(f)[0]
    return step

  if impl == "keras_embedding":
    layers = {n: tf.keras.layers.Embedding(args.rows, args.dim) for n in names}
    for layer in layers.values():
      layer.build([None])
    opt = tf.keras.optimizers.Adagrad(args.lr)
    variables = [v for n in names for v in layers[n].trainable_variables] + \
        head.trainable_variables

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = [tf.reduce_sum(layers[n](features[n]), axis=1) for n in names]
        loss = bce(labels, head(tf.concat(acts, axis=1)))
      grads = tape.gradient(loss, variables)
      opt.apply_gradients(zip(grads, variables))
      return loss
    return step

  if impl == "tf_sparse_fused":
    init = tf.keras.initializers.TruncatedNormal(stddev=args.dim ** -0.5)
    tables = {n: tf.Variable(init([args.rows, args.dim])) for n in names}
    accs = {n: tf.Variable(tf.fill([args.rows, args.dim], 0.1)) for n in names}

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = [tf.nn.safe_embedding_lookup_sparse(
            tables[n], features[n].to_sparse(), combiner="sum") for n in names]
        loss = bce(labels, head(tf.concat(acts, axis=1)))
      grads = tape.gradient(loss, [tables[n] for n in names] + head.trainable_variables)
      for n, g in zip(names, grads[:len(names)]):
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=tables[n].handle, accum=accs[n].handle, lr=args.lr, epsilon=0.0,
            grad=g.values, indices=g.indices)
      head_opt.apply_gradients(zip(grads[len(names):], head.trainable_variables))
      return loss
    return step

  raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


def run_one(impl: str, args) -> Dict[str, float]:
  """Times one implementation in this process; returns its figures."""
  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
  batches = make_batches(args.distinct_batches, args.batch, args.features,
                         args.rows, args.max_bag, args.zipf, args.seed)
  inputs = [_ragged(b) for b in batches]
  labels = [tf.constant(np.random.default_rng(i).integers(0, 2, (args.batch, 1)),
                        tf.float32) for i in range(len(batches))]
  step = build_step(impl, args)
  if isinstance(step, tuple):  # host-side preparation, outside the timing
    step, prepare = step
    inputs = [prepare(f) for f in inputs]
  for i in range(args.warmup):
    step(inputs[i % len(inputs)], labels[i % len(inputs)]).numpy()
  times = []
  for i in range(args.steps):
    j = i % len(inputs)
    start = time.perf_counter()
    step(inputs[j], labels[j]).numpy()
    times.append(time.perf_counter() - start)
  ids_per_step = np.mean([sum(len(v) for v, _ in b.values()) for b in batches])
  median = statistics.median(times)
  return {"impl": impl, "step_ms": median * 1e3,
          "examples_per_s": args.batch / median,
          "ids_per_s": ids_per_step / median,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--impls", default=",".join(IMPLS),
                      help=f"comma-separated, first is the baseline of the ratios; from {IMPLS}")
  parser.add_argument("--rows", default="200000",
                      help="table rows; a comma-separated list sweeps sizes")
  parser.add_argument("--batches", default="2048",
                      help="batch size; a comma-separated list sweeps sizes")
  parser.add_argument("--features", type=int, default=8)
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--max_bag", type=int, default=8)
  parser.add_argument("--zipf", type=float, default=1.05)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--distinct_batches", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3,
                      help="interleaved rounds (each impl once per round)")
  parser.add_argument("--intra_threads", type=int, default=2)
  parser.add_argument("--inter_threads", type=int, default=1)
  parser.add_argument("--json", help="also write the results here")
  parser.add_argument("--_child", help=argparse.SUPPRESS)
  parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args._child:  # pylint: disable=protected-access
    args.rows = int(args.rows)
    print(json.dumps(run_one(args._child, args)))  # pylint: disable=protected-access
    return

  impls = args.impls.split(",")
  results = []
  for rows in args.rows.split(","):
    for batch in args.batches.split(","):
      runs = {impl: [] for impl in impls}
      for _ in range(args.repeats):
        for impl in impls:
          cmd = [sys.executable, __file__, "--_child", impl, "--rows", rows,
                 "--batch", batch] + [f"--{k}={getattr(args, k)}" for k in (
                     "features", "dim", "max_bag", "zipf", "lr", "seed", "warmup",
                     "steps", "distinct_batches", "intra_threads", "inter_threads")]
          env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
          out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
          if out.returncode != 0:
            print(f"{impl} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
          runs[impl].append(json.loads(out.stdout.strip().splitlines()[-1]))
      base = None
      for impl in impls:
        if not runs[impl]:
          continue
        row = {k: statistics.median(r[k] for r in runs[impl])
               for k in ("step_ms", "examples_per_s", "ids_per_s", "peak_rss_mb")}
        row.update(impl=impl, rows=int(rows), batch=int(batch), runs=len(runs[impl]))
        base = base or row["ids_per_s"]
        row["ratio"] = row["ids_per_s"] / base
        results.append(row)
  print(f"{'impl':20s} {'rows':>9s} {'batch':>6s} {'step ms':>8s} {'examples/s':>11s} "
        f"{'M ids/s':>8s} {'ratio':>6s} {'RSS MB':>7s}")
  for r in results:
    print(f"{r['impl']:20s} {r['rows']:9d} {r['batch']:6d} {r['step_ms']:8.1f} "
          f"{r['examples_per_s']:11.0f} {r['ids_per_s'] / 1e6:8.2f} {r['ratio']:6.2f} "
          f"{r['peak_rss_mb']:7.0f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
