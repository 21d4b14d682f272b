"""Embedding training-step throughput: recsys vs. other implementations.

The standard workload (issue 6): 8 categorical features, each with its own
table of 200,000 x 32; multi-hot bags of 1-8 ids (uniform length), Zipf-skewed
ids (s = 1.05, fixed seed); sum combiner; batch 2048; a tiny dense head
(concat -> Dense(1)) with binary cross-entropy on random labels; Adagrad
lr 0.05 on the tables. One step = forward + backward + embedding update.

Each implementation runs in its own subprocess (clean peak RSS, no shared
caches or thread pools); implementations are interleaved over `--repeats`
rounds so a busy machine slows them alike. The table reports, per
implementation, the median over rounds of each run's median step time after
warm-up, examples/s, ids/s, the ratio of ids/s to the first implementation,
and peak RSS. Thread settings are set explicitly and printed.

Implementations (those whose packages are missing are skipped with a line):
  recsys           backends.create(backend="tensorcore", bag_widths=8): the
                   trainer's path, bags padded to [B, 8] by `preprocess` in
                   the input pipeline (done once here, outside the timing)
  recsys_ragged    the same backend fed RaggedTensor bags directly
  recsys_tf_ops    `recsys` without its fused CPU kernels (fused_kernels=False):
                   the TF-ops path, for the kernels' A/B
  recsys_xla       `recsys` with the step in tf.function(jit_compile=True):
                   the static-shape path a TPU compiles, here compiled by
                   XLA for the CPU (--bag_width sets the padded width, to
                   measure what static capacity costs)
  tfrs             tfrs.layers.embedding.TPUEmbedding on CPU, SparseTensor
                   input, legacy Keras Adagrad
  keras_embedding  tf_keras Embedding per feature on RaggedTensor bags,
                   Keras Adagrad
  tf_fused         tf.nn.safe_embedding_lookup_sparse (SparseTensor input) +
                   raw ResourceSparseApplyAdagradV2
  torch_bag        torch nn.EmbeddingBag(sparse=True) + torch Adagrad
  fbgemm           FBGEMM SplitTableBatchedEmbeddingBagsCodegen (EXACT_ADAGRAD)
  torchrec         TorchRec FusedEmbeddingBagCollection, fused Adagrad

Examples (B = python benchmarks/embedding_step.py):
  B                                            # standard workload
  B --impls recsys,fbgemm --rows 10000,1000000,10000000
  B --impls recsys --batch 512,2048,16384 --json out.json
  B --impls recsys,recsys_tf_ops --profile --steps 20
  B --impls recsys_xla,recsys --bag_width 16
  B --impls recsys --features 1 --rows 10000000 --batch 4096,16384 \
    --intra_threads 1,2
      # one big table on 1 vs 2 intra-op threads (settings interleaved too)

Torch, FBGEMM and TorchRec come from the `bench` extra (benchmarks/README.md:
a separate venv, named by --torch_python or $RECSYS_BENCH_TORCH_PYTHON).
"""

import argparse
import functools
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

IMPLS = (
  "recsys",
  "recsys_ragged",
  "recsys_tf_ops",
  "recsys_xla",
  "tfrs",
  "keras_embedding",
  "tf_fused",
  "torch_bag",
  "fbgemm",
  "torchrec",
)
DEFAULT_IMPLS = (
  "recsys",
  "tfrs",
  "keras_embedding",
  "tf_fused",
  "torch_bag",
  "fbgemm",
  "torchrec",
)
_NEEDS = {
  "torch_bag": ("torch",),
  "fbgemm": ("torch", "fbgemm_gpu"),
  "torchrec": ("torch", "fbgemm_gpu", "torchrec"),
  "tfrs": ("tensorflow_recommenders",),
}

Batch = dict[str, tuple[np.ndarray, np.ndarray]]


def make_batches(
  num_batches: int,
  batch: int,
  features: int,
  rows: int,
  max_bag: int,
  zipf: float,
  seed: int,
) -> list[Batch]:
  """Pre-generated batches: per feature (ids int64 [N], lengths int64 [B])."""
  rng = np.random.default_rng(seed)
  ranks = np.arange(1, rows + 1, dtype=np.float64)
  cdf = np.cumsum(ranks**-zipf)
  cdf /= cdf[-1]
  permutation = rng.permutation(rows)  # hot ids spread over the table
  batches = []
  for _ in range(num_batches):
    feats = {}
    for f in range(features):
      lengths = rng.integers(1, max_bag + 1, size=batch)
      ids = permutation[
        np.minimum(np.searchsorted(cdf, rng.random(lengths.sum())), rows - 1)
      ]
      feats[f"f{f}"] = (ids.astype(np.int64), lengths.astype(np.int64))
    batches.append(feats)
  return batches


def make_labels(num_batches: int, batch: int, seed: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed + 1)
  return [
    rng.integers(0, 2, (batch, 1)).astype(np.float32)
    for _ in range(num_batches)
  ]


# -- TensorFlow implementations ------------------------------------------------


def _tf_step(impl: str, args) -> tuple[Callable, Callable]:
  """(step(inputs, labels) -> loss, prepare(batch) -> inputs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  E = tf.tpu.experimental.embedding
  names = [f"f{i}" for i in range(args.features)]
  head = tf.keras.layers.Dense(1)
  head.build([None, args.features * args.dim])
  head_opt = tf.keras.optimizers.SGD(0.01)
  bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)

  def ragged(batch):
    return {
      k: tf.RaggedTensor.from_row_lengths(v, n) for k, (v, n) in batch.items()
    }

  def sparse(batch):
    return {k: r.to_sparse() for k, r in ragged(batch).items()}

  if impl in ("recsys", "recsys_ragged", "recsys_tf_ops", "recsys_xla"):
    import backends  # pylint: disable=g-import-not-at-top

    tables = {
      n: E.TableConfig(args.rows, args.dim, combiner="sum", name=n)
      for n in names
    }
    config = {n: E.FeatureConfig(tables[n]) for n in names}
    emb = backends.create(
      config,
      E.Adagrad(args.lr),
      backend="tensorcore",
      bag_widths=None
      if impl == "recsys_ragged"
      else args.bag_width or args.max_bag,
      fused_kernels=impl != "recsys_tf_ops",
    )
    emb.build()
    lookup = tf.autograph.experimental.do_not_convert(emb.lookup)
    apply = tf.autograph.experimental.do_not_convert(emb.apply_gradients)

    @functools.partial(tf.function, jit_compile=impl == "recsys_xla")
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = lookup(features, training=True)
        tape.watch(acts)
        logits = head(tf.concat([acts[n] for n in names], axis=1))
        loss = bce(labels, logits)
      dense_grads, act_grads = tape.gradient(
        loss, (head.trainable_variables, acts)
      )
      head_opt.apply_gradients(zip(dense_grads, head.trainable_variables))
      apply(act_grads)
      return loss

    if impl != "recsys_ragged":
      # The trainer runs preprocess() in its tf.data pipeline (in parallel
      # with the step); here it runs once per distinct batch, not timed.
      return step, lambda b: emb.preprocess(ragged(b))[0]
    return step, ragged

  if impl == "tfrs":
    import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top

    config = {
      n: E.FeatureConfig(
        E.TableConfig(args.rows, args.dim, combiner="sum", name=n)
      )
      for n in names
    }
    opt = tf.keras.optimizers.legacy.Adagrad(args.lr)
    layer = tfrs.layers.embedding.TPUEmbedding(config, opt)
    layer(
      sparse(
        make_batches(
          1, 4, args.features, args.rows, args.max_bag, args.zipf, 1
        )[0]
      )
    )
    tvars = layer.trainable_variables

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = layer(features)
        loss = bce(labels, head(tf.concat([acts[n] for n in names], axis=1)))
      grads = tape.gradient(loss, tvars + head.trainable_variables)
      opt.apply_gradients(zip(grads[: len(tvars)], tvars))
      head_opt.apply_gradients(
        zip(grads[len(tvars) :], head.trainable_variables)
      )
      return loss

    return step, sparse

  if impl == "keras_embedding":
    layers = {n: tf.keras.layers.Embedding(args.rows, args.dim) for n in names}
    for layer in layers.values():
      layer.build([None])
    opt = tf.keras.optimizers.Adagrad(args.lr)
    variables = [v for n in names for v in layers[n].trainable_variables]

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = [tf.reduce_sum(layers[n](features[n]), axis=1) for n in names]
        loss = bce(labels, head(tf.concat(acts, axis=1)))
      grads = tape.gradient(loss, variables + head.trainable_variables)
      opt.apply_gradients(zip(grads[: len(variables)], variables))
      head_opt.apply_gradients(
        zip(grads[len(variables) :], head.trainable_variables)
      )
      return loss

    return step, ragged

  if impl == "tf_fused":
    init = tf.keras.initializers.TruncatedNormal(stddev=args.dim**-0.5)
    tables = {n: tf.Variable(init([args.rows, args.dim])) for n in names}
    accs = {n: tf.Variable(tf.fill([args.rows, args.dim], 0.1)) for n in names}

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        acts = [
          tf.nn.safe_embedding_lookup_sparse(
            tables[n], features[n], combiner="sum"
          )
          for n in names
        ]
        loss = bce(labels, head(tf.concat(acts, axis=1)))
      grads = tape.gradient(
        loss, [tables[n] for n in names] + head.trainable_variables
      )
      for n, g in zip(names, grads[: len(names)]):
        tf.raw_ops.ResourceSparseApplyAdagradV2(
          var=tables[n].handle,
          accum=accs[n].handle,
          lr=args.lr,
          epsilon=0.0,
          grad=g.values,
          indices=g.indices,
        )
      head_opt.apply_gradients(
        zip(grads[len(names) :], head.trainable_variables)
      )
      return loss

    return step, sparse

  raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


# -- PyTorch implementations ---------------------------------------------------


def _torch_step(impl: str, args) -> tuple[Callable, Callable]:
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.intra_threads)
  torch.manual_seed(args.seed)
  names = [f"f{i}" for i in range(args.features)]
  head = torch.nn.Linear(args.features * args.dim, 1)
  head_opt = torch.optim.SGD(head.parameters(), lr=0.01)
  bce = torch.nn.BCEWithLogitsLoss()

  def finish(pooled, labels):
    loss = bce(head(pooled), labels)
    head_opt.zero_grad()
    loss.backward()
    head_opt.step()
    return loss

  if impl == "torch_bag":
    bags = torch.nn.ModuleList(
      torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True)
      for _ in names
    )
    opt = torch.optim.Adagrad(bags.parameters(), lr=args.lr)

    def prepare(batch):
      out = []
      for n in names:
        ids, lengths = batch[n]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out.append((torch.from_numpy(ids), torch.from_numpy(offsets)))
      return out

    def step(inputs, labels):
      opt.zero_grad()
      pooled = torch.cat(
        [bag(i, o) for bag, (i, o) in zip(bags, inputs)], dim=1
      )
      loss = finish(pooled, labels)
      opt.step()
      return loss

    return step, prepare

  if impl == "fbgemm":
    # pylint: disable=g-import-not-at-top
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
      EmbeddingLocation,
      PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
      ComputeDevice,
      SplitTableBatchedEmbeddingBagsCodegen,
    )

    emb = SplitTableBatchedEmbeddingBagsCodegen(
      embedding_specs=[
        (args.rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
        for _ in names
      ],
      optimizer=EmbOptimType.EXACT_ADAGRAD,
      learning_rate=args.lr,
      pooling_mode=PoolingMode.SUM,
    )

    def prepare(batch):
      ids = np.concatenate([batch[n][0] for n in names])
      lengths = np.concatenate([batch[n][1] for n in names])
      offsets = np.concatenate([[0], np.cumsum(lengths)])
      return torch.from_numpy(ids), torch.from_numpy(offsets)

    def step(inputs, labels):
      return finish(emb(inputs[0], inputs[1]), labels)

    return step, prepare

  if impl == "torchrec":
    # pylint: disable=g-import-not-at-top
    from torchrec.modules.embedding_configs import (
      EmbeddingBagConfig,
      PoolingType,
    )
    from torchrec.modules.fused_embedding_modules import (
      FusedEmbeddingBagCollection,
    )
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ebc = FusedEmbeddingBagCollection(
      tables=[
        EmbeddingBagConfig(
          name=f"t_{n}",
          embedding_dim=args.dim,
          num_embeddings=args.rows,
          feature_names=[n],
          pooling=PoolingType.SUM,
        )
        for n in names
      ],
      optimizer_type=torch.optim.Adagrad,
      optimizer_kwargs={"lr": args.lr},
      device=torch.device("cpu"),
    )

    def prepare(batch):
      return KeyedJaggedTensor.from_lengths_sync(
        keys=names,
        values=torch.from_numpy(np.concatenate([batch[n][0] for n in names])),
        lengths=torch.from_numpy(np.concatenate([batch[n][1] for n in names])),
      )

    def step(inputs, labels):
      return finish(ebc(inputs).values(), labels)

    return step, prepare

  raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


# -- one run (child process) ---------------------------------------------------


def run_one(impl: str, args) -> dict[str, Any]:
  """Times one implementation in this process; returns its figures."""
  batches = make_batches(
    args.distinct_batches,
    args.batch,
    args.features,
    args.rows,
    args.max_bag,
    args.zipf,
    args.seed,
  )
  labels = make_labels(len(batches), args.batch, args.seed)
  if impl in ("torch_bag", "fbgemm", "torchrec"):
    import torch  # pylint: disable=g-import-not-at-top

    step, prepare = _torch_step(impl, args)
    inputs = [prepare(b) for b in batches]
    labels = [torch.from_numpy(y) for y in labels]

    def sync(loss):
      return float(loss.detach())

  else:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
    step, prepare = _tf_step(impl, args)
    inputs = [prepare(b) for b in batches]
    labels = [tf.constant(y) for y in labels]

    def sync(loss):
      return float(loss.numpy())

  n = len(inputs)
  for i in range(args.warmup):
    sync(step(inputs[i % n], labels[i % n]))
  times = []
  start_cpu = time.process_time()
  for i in range(args.steps):
    start = time.perf_counter()
    sync(step(inputs[i % n], labels[i % n]))
    times.append(time.perf_counter() - start)
  # Process CPU time per step (all threads): on a shared machine the
  # steadier figure, and the efficiency one (2 busy threads = 2x the wall).
  cpu_per_step = (time.process_time() - start_cpu) / args.steps
  ids_per_step = float(
    np.mean([sum(len(v) for v, _ in b.values()) for b in batches])
  )
  median = statistics.median(times)
  return {
    "impl": impl,
    "step_ms": median * 1e3,
    "examples_per_s": args.batch / median,
    "ids_per_s": ids_per_step / median,
    "cpu_ms_per_step": cpu_per_step * 1e3,
    "ids_per_cpu_s": ids_per_step / cpu_per_step,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }


def profile_one(impl: str, args) -> None:
  """Prints the op-time table of `args.steps` steps of a TF implementation."""
  import op_profile  # pylint: disable=g-import-not-at-top  (this folder)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
  step, prepare = _tf_step(impl, args)
  batches = make_batches(
    args.distinct_batches,
    args.batch,
    args.features,
    args.rows,
    args.max_bag,
    args.zipf,
    args.seed,
  )
  inputs = [prepare(b) for b in batches]
  labels = [
    tf.constant(y) for y in make_labels(len(batches), args.batch, args.seed)
  ]
  batch_numbers = itertools.count()

  def run():
    i = next(batch_numbers) % len(inputs)
    step(inputs[i], labels[i]).numpy()

  for _ in range(args.warmup):
    run()
  print(f"\n{impl} (rows={args.rows}, batch={args.batch}, {args.steps} steps):")
  op_profile.print_op_table(op_profile.profile_steps(run, args.steps))


# -- driver --------------------------------------------------------------------


TORCH_IMPLS = ("torch_bag", "fbgemm", "torchrec")


def torch_python(args=None) -> str:
  """The interpreter that runs the torch-based sides.

  `--torch_python`, else $RECSYS_BENCH_TORCH_PYTHON, else this one. torch and
  TensorFlow each bring hundreds of MB of shared libraries and their own
  NumPy pins; a separate venv (benchmarks/README.md) keeps the project's
  venv free of them. The children only need NumPy besides torch.
  """
  return (
    getattr(args, "torch_python", None)
    or os.environ.get("RECSYS_BENCH_TORCH_PYTHON")
    or sys.executable
  )


def missing_packages(impl: str, python: str | None = None) -> list[str]:
  """The packages `impl` needs that `python` (default: this one) lacks."""
  needs = list(_NEEDS.get(impl, ()))
  if not needs:
    return []
  if python and python != sys.executable:
    out = subprocess.run(
      [
        python,
        "-c",
        "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:]"
        " if importlib.util.find_spec(m) is None))",
        *needs,
      ],
      capture_output=True,
      text=True,
      check=False,
    )
    if out.returncode != 0:
      return [f"(interpreter {python} failed)"]
    return out.stdout.split()
  import importlib.util  # pylint: disable=g-import-not-at-top

  return [m for m in needs if importlib.util.find_spec(m) is None]


def python_for(impl: str, args=None) -> str:
  """The interpreter a child of `impl` runs in."""
  return torch_python(args) if impl in TORCH_IMPLS else sys.executable


def thread_env(args, intra: int = 0) -> dict[str, str]:
  """The threading environment a child runs with (printed in the header).

  `intra` is one of `--intra_threads`' settings (default: the first).
  """
  intra = intra or intra_settings(args)[0]
  return {
    "OMP_NUM_THREADS": str(intra),
    # spinning OpenMP threads starve the other core
    "OMP_WAIT_POLICY": "PASSIVE",
    "MKL_NUM_THREADS": str(intra),
    "TF_NUM_INTRAOP_THREADS": str(intra),
    "TF_NUM_INTEROP_THREADS": str(args.inter_threads),
    "TF_CPP_MIN_LOG_LEVEL": "3",
  }


def intra_settings(args) -> list[int]:
  """`--intra_threads` as a list: several settings are swept, interleaved."""
  return [int(t) for t in str(args.intra_threads).split(",")]


_FIGURES = (
  "step_ms",
  "examples_per_s",
  "ids_per_s",
  "cpu_ms_per_step",
  "ids_per_cpu_s",
  "peak_rss_mb",
)
_CHILD_FLAGS = (
  "features",
  "dim",
  "max_bag",
  "bag_width",
  "zipf",
  "lr",
  "seed",
  "warmup",
  "steps",
  "distinct_batches",
  "inter_threads",
)


def sweep(args, impls: list[str]) -> list[dict[str, Any]]:
  """Runs every (rows, batch) point, impls and thread settings interleaved."""
  results = []
  variants = [(impl, t) for impl in impls for t in intra_settings(args)]
  for rows in args.rows.split(","):
    for batch in args.batch.split(","):
      runs: dict[tuple[str, int], list[dict[str, Any]]] = {
        v: [] for v in variants
      }
      for _ in range(args.repeats):
        for impl, intra in variants:
          env = dict(os.environ, **thread_env(args, intra))
          cmd = [
            python_for(impl, args),
            os.path.abspath(__file__),
            "--_child",
            impl,
            f"--rows={rows}",
            f"--batch={batch}",
            f"--intra_threads={intra}",
          ] + [f"--{k}={getattr(args, k)}" for k in _CHILD_FLAGS]
          out = subprocess.run(
            cmd, capture_output=True, text=True, env=env, check=False
          )
          if out.returncode != 0:
            print(
              f"{impl} (rows={rows}, batch={batch}) failed:\n"
              f"{out.stderr[-2000:]}",
              file=sys.stderr,
            )
            continue
          runs[(impl, intra)].append(
            json.loads(out.stdout.strip().splitlines()[-1])
          )
          print(
            f"  round: {impl:16s} rows={rows} batch={batch} intra={intra} "
            f"{runs[(impl, intra)][-1]['ids_per_s'] / 1e6:.2f} M ids/s",
            file=sys.stderr,
          )
      base = None
      for impl, intra in variants:
        if not runs[(impl, intra)]:
          continue
        row: dict[str, Any] = {
          k: statistics.median(r[k] for r in runs[(impl, intra)])
          for k in _FIGURES
        }
        row.update(
          impl=impl,
          rows=int(rows),
          batch=int(batch),
          intra=intra,
          runs=len(runs[(impl, intra)]),
        )
        base = base or row
        row["ratio"] = row["ids_per_s"] / base["ids_per_s"]
        row["cpu_ratio"] = row["ids_per_cpu_s"] / base["ids_per_cpu_s"]
        results.append(row)
  return results


def print_table(results: list[dict[str, Any]]) -> None:
  """Markdown table; ratios are to the first implementation's figure."""
  print(
    "| implementation | rows | batch | intra | step ms | examples/s | "
    "M ids/s | ratio | CPU ms/step | M ids per CPU-s | CPU ratio | RSS MB |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in results:
    print(
      f"| {r['impl']} | {r['rows']} | {r['batch']} | {r['intra']} | "
      f"{r['step_ms']:.1f} | {r['examples_per_s']:.0f} | "
      f"{r['ids_per_s'] / 1e6:.2f} | {r['ratio']:.2f} | "
      f"{r['cpu_ms_per_step']:.1f} | {r['ids_per_cpu_s'] / 1e6:.2f} | "
      f"{r['cpu_ratio']:.2f} | {r['peak_rss_mb']:.0f} |"
    )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--impls",
    default=",".join(DEFAULT_IMPLS),
    help=f"comma-separated, the first is the base of the ratios; from {IMPLS}",
  )
  parser.add_argument(
    "--rows",
    default="200000",
    help="rows per table; a comma-separated list sweeps sizes",
  )
  parser.add_argument(
    "--batch",
    default="2048",
    help="batch size; a comma-separated list sweeps sizes",
  )
  parser.add_argument("--features", type=int, default=8)
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--max_bag", type=int, default=8)
  parser.add_argument(
    "--bag_width",
    type=int,
    default=0,
    help="static width recsys pads bags to (default: max_bag)",
  )
  parser.add_argument("--zipf", type=float, default=1.05)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--distinct_batches", type=int, default=8)
  parser.add_argument(
    "--repeats",
    type=int,
    default=3,
    help="interleaved rounds (each implementation once per round)",
  )
  parser.add_argument(
    "--intra_threads",
    default="2",
    help="TF intra-op threads = torch/OpenMP threads; a "
    "comma-separated list sweeps settings, interleaved",
  )
  parser.add_argument(
    "--inter_threads", type=int, default=2, help="TF inter-op threads"
  )
  parser.add_argument(
    "--json", help="also write the results (and settings) here"
  )
  parser.add_argument(
    "--profile",
    action="store_true",
    help="instead of timing: the op-time table of each TF "
    "implementation (TF profiler, --steps steps)",
  )
  parser.add_argument(
    "--torch_python",
    help="interpreter for torch_bag/fbgemm/torchrec (default: "
    "$RECSYS_BENCH_TORCH_PYTHON, else this one)",
  )
  parser.add_argument("--_child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args._child:  # pylint: disable=protected-access
    args.rows, args.batch = int(args.rows), int(args.batch)
    args.intra_threads = intra_settings(args)[0]
    if args.profile:
      profile_one(args._child, args)  # pylint: disable=protected-access
      return
    print(json.dumps(run_one(args._child, args)))  # pylint: disable=protected-access
    return

  impls = []
  for impl in args.impls.split(","):
    if impl not in IMPLS:
      parser.error(
        f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}"
      )
    missing = missing_packages(impl, python_for(impl, args))
    if missing:
      print(
        f"skipping {impl}: package(s) {', '.join(missing)} not installed "
        "(pip install -e '.[bench]')"
      )
    else:
      impls.append(impl)
  settings = {
    "machine": f"{platform.machine()}, {os.cpu_count()} cpus, "
    f"{platform.python_version()}",
    "threads": thread_env(args),
    "intra_threads": intra_settings(args),
    "features": args.features,
    "dim": args.dim,
    "max_bag": args.max_bag,
    "bag_width": args.bag_width or args.max_bag,
    "zipf": args.zipf,
    "steps": args.steps,
    "warmup": args.warmup,
    "repeats": args.repeats,
  }
  print("settings: " + json.dumps(settings))
  if args.profile:
    env = dict(os.environ, **thread_env(args))
    for impl in impls:
      if impl in TORCH_IMPLS:
        print(f"\n{impl}: --profile covers the TF implementations only")
        continue
      subprocess.run(
        [
          sys.executable,
          os.path.abspath(__file__),
          "--_child",
          impl,
          "--profile",
          f"--rows={args.rows.split(',')[0]}",
          f"--intra_threads={intra_settings(args)[0]}",
          f"--batch={args.batch.split(',')[0]}",
        ]
        + [f"--{k}={getattr(args, k)}" for k in _CHILD_FLAGS],
        env=env,
        check=False,
      )
    return
  results = sweep(args, impls)
  print_table(results)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"settings": settings, "results": results}, f, indent=1)


if __name__ == "__main__":
  main()
