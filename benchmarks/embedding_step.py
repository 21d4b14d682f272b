"""Embedding training-step throughput: recsys vs. other implementations.

The standard workload (issue 6): 8 categorical features, each with its own
table of 200,000 x 32; multi-hot bags of 1-8 ids (uniform length), Zipf-skewed
ids (s = 1.05, fixed seed); sum combiner; batch 2048; a tiny dense head
(concat -> Dense(1)) with binary cross-entropy on random labels; Adagrad
lr 0.05 on the tables. One step = forward + backward + embedding update.

Each implementation runs in its own subprocess (clean peak RSS, no shared
caches or thread pools); implementations are interleaved over `--repeats`
rounds so a busy machine slows them alike. The first table reports, per
implementation and thread setting, the median over rounds of each run's
median step time after warm-up, examples/s, ids/s, CPU time per step and
peak RSS; the second, the first implementation (recsys) against each other
one at that one's best setting (issue 46: a fair race). `--busy_cores 0,1`
also runs every setting beside a process spinning on one core, interleaved
with its quiet runs; a third table gives each setting's loaded throughput
over its quiet one (issue 46: a step on a shared machine).

Threads, set explicitly and printed (with the machine's load and its other
busy processes, before and after):
  recsys*          TF intra-op / inter-op threads as `recsys train` chooses
                   them here (recsys.process.threads: 1 / 2 on 2 cores or
                   fewer, else TF's defaults), or `--intra_threads` (a comma
                   list sweeps) and `--inter_threads`
  tfrs, keras_embedding, tf_fused
                   TF intra-op threads swept over `--tf_threads` (default
                   1,2), inter-op as recsys's (TF's default, the cores, when
                   recsys leaves it unset)
  torch_bag, fbgemm, torchrec
                   torch.set_num_threads = OMP_NUM_THREADS = MKL_NUM_THREADS
                   swept over `--torch_threads` (default 1,2); torch's
                   inter-op pool left at its default (printed)
TF links no OpenMP (its oneDNN runs on TF's own thread pools), so
OMP_NUM_THREADS / OMP_WAIT_POLICY matter to the torch children only;
OMP_WAIT_POLICY is the caller's (PASSIVE when unset, as `make bench` sets).

Implementations (those whose packages are missing are skipped with a line):
  recsys           backends.create(backend="tensorcore", bag_widths=8): the
                   trainer's path, bags padded to [B, 8] by `preprocess` in
                   the input pipeline (done once here, outside the timing)
  recsys_ragged    the same backend fed RaggedTensor bags directly
  recsys_tf_ops    `recsys` without its fused CPU kernels (fused_kernels=False):
                   the TF-ops path, for the kernels' A/B
  recsys_bf16,     `recsys` with bfloat16 / float16 tables (table_dtype; rows
  recsys_fp16      read and written narrow by the fused kernels), to race
                   float32 side by side: --impls recsys,recsys_bf16
  recsys_dynamic   `recsys` with dynamic-vocabulary tables: raw 64-bit ids
                   mapped to rows by each table's index in the step
                   (`backends.vocabulary`; capacity = --rows), to race the
                   static tables: --impls recsys,recsys_dynamic
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
  B --impls recsys,fbgemm,torchrec --torch_threads 1,2,4

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import race  # noqa: E402  (this folder: machine state, best settings)
import tables  # noqa: E402  (this folder: Markdown tables)

IMPLS = (
  "recsys",
  "recsys_ragged",
  "recsys_tf_ops",
  "recsys_xla",
  "recsys_bf16",
  "recsys_fp16",
  "recsys_dynamic",
  "tfrs",
  "keras_embedding",
  "tf_fused",
  "torch_bag",
  "fbgemm",
  "torchrec",
)
# recsys with its tables stored narrow (whatever --table_dtype says), to
# race float32 side by side in one run.
_NARROW_IMPLS = {"recsys_bf16": "bfloat16", "recsys_fp16": "float16"}
# Every implementation but recsys's variants of itself.
DEFAULT_IMPLS = tuple(i for i in IMPLS if not i.startswith("recsys_"))
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


def raw_ids(batch: Batch) -> Batch:
  """`batch` with each id made a raw 64-bit id (an odd multiplier: a
  bijection of int64, so distinct ids stay distinct)."""
  odd = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64
  with np.errstate(over="ignore"):
    return {k: (ids * odd, n) for k, (ids, n) in batch.items()}


def args_batches(args) -> list[Batch]:
  """The `--distinct_batches` batches the flags describe."""
  return make_batches(
    args.distinct_batches,
    args.batch,
    args.features,
    args.rows,
    args.max_bag,
    args.zipf,
    args.seed,
  )


def add_step_arguments(
  parser: argparse.ArgumentParser,
  distinct_batches: int = 8,
  table_dtype_help: str = "the tables' storage (tensorcore's table_dtype)",
) -> None:
  """The flags this file's batches and recsys step read (`--dim`, `--max_bag`,
  `--zipf`, `--lr`, `--seed`, `--distinct_batches`, `--table_dtype`), for the
  scripts that time them."""
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--max_bag", type=int, default=8)
  parser.add_argument("--zipf", type=float, default=1.05)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--distinct_batches", type=int, default=distinct_batches)
  parser.add_argument(
    "--table_dtype",
    default="float32",
    choices=("float32", "bfloat16", "float16"),
    help=table_dtype_help,
  )


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

  def keras_step(embed, variables, opt):
    """A step training `variables` with the Keras optimizer `opt` (the head
    with `head_opt`); `embed(features)` gives the activations `[B, F * D]`."""

    @tf.function
    def step(features, labels):
      with tf.GradientTape() as tape:
        loss = bce(labels, head(embed(features)))
      grads = tape.gradient(loss, variables + head.trainable_variables)
      opt.apply_gradients(zip(grads[: len(variables)], variables))
      head_opt.apply_gradients(
        zip(grads[len(variables) :], head.trainable_variables)
      )
      return loss

    return step

  recsys_impls = ("recsys", "recsys_ragged", "recsys_tf_ops", "recsys_xla")
  if impl in recsys_impls + ("recsys_dynamic",) or impl in _NARROW_IMPLS:
    import backends  # pylint: disable=g-import-not-at-top
    from backends.layout import TableLayout  # pylint: disable=g-import-not-at-top
    from backends.vocabulary import DynamicVocabulary  # pylint: disable=g-import-not-at-top

    dynamic = impl == "recsys_dynamic"

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
      layouts=TableLayout(
        dtype=_NARROW_IMPLS.get(impl, args.table_dtype),
        # Raw ids (the batches' ids made 64-bit) through an index whose
        # capacity is the table's rows: what a dynamic table adds per step.
        vocabulary=DynamicVocabulary(shards=args.index_shards)
        if dynamic
        else None,
      ),
    )
    emb.build()
    lookup = tf.autograph.experimental.do_not_convert(emb.lookup)
    apply = tf.autograph.experimental.do_not_convert(emb.apply_gradients)
    map_ids = tf.autograph.experimental.do_not_convert(emb.map_ids)

    @functools.partial(tf.function, jit_compile=impl == "recsys_xla")
    def step(features, labels):
      if dynamic:
        features = map_ids(features, training=True)
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

    if dynamic:
      return step, lambda b: emb.preprocess(ragged(raw_ids(b)))[0]
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

    def tfrs_acts(features):
      acts = layer(features)
      return tf.concat([acts[n] for n in names], axis=1)

    return keras_step(tfrs_acts, layer.trainable_variables, opt), sparse

  if impl == "keras_embedding":
    layers = {n: tf.keras.layers.Embedding(args.rows, args.dim) for n in names}
    for layer in layers.values():
      layer.build([None])
    opt = tf.keras.optimizers.Adagrad(args.lr)
    variables = [v for n in names for v in layers[n].trainable_variables]

    def bag_sums(features):
      acts = [tf.reduce_sum(layers[n](features[n]), axis=1) for n in names]
      return tf.concat(acts, axis=1)

    return keras_step(bag_sums, variables, opt), ragged

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


def tf_step_with_threads(impl: str, args) -> tuple[Callable, Callable]:
  """`_tf_step` in a TF set to the `--intra_threads`/`--inter_threads`
  thread pools (before any op runs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
  return _tf_step(impl, args)


# -- PyTorch implementations ---------------------------------------------------


def _torch_step(impl: str, args) -> tuple[Callable, Callable]:
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args.torch_threads)
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
  batches = args_batches(args)
  labels = make_labels(len(batches), args.batch, args.seed)
  if impl in ("torch_bag", "fbgemm", "torchrec"):
    import torch  # pylint: disable=g-import-not-at-top

    step, prepare = _torch_step(impl, args)
    as_tensor = torch.from_numpy

    def sync(loss):
      return float(loss.detach())

    threads = torch_threads_seen()
  else:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    step, prepare = tf_step_with_threads(impl, args)
    as_tensor = tf.constant

    def sync(loss):
      return float(loss.numpy())

    threads = tf_threads_seen()
  inputs = [prepare(b) for b in batches]
  labels = [as_tensor(y) for y in labels]
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
    "threads": threads,
    "step_ms": median * 1e3,
    "examples_per_s": args.batch / median,
    "ids_per_s": ids_per_step / median,
    "cpu_ms_per_step": cpu_per_step * 1e3,
    "ids_per_cpu_s": ids_per_step / cpu_per_step,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }


def torch_threads_seen() -> str:
  """The torch thread settings this child runs with, as torch reports them:
  its intra-op threads (OpenMP) and its inter-op pool."""
  import torch  # pylint: disable=g-import-not-at-top

  return (
    f"torch {torch.get_num_threads()} "
    f"(interop {torch.get_num_interop_threads()})"
  )


def tf_threads_seen() -> str:
  """TF's intra-op / inter-op threads in this child, as TF reports them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  intra = tf.config.threading.get_intra_op_parallelism_threads()
  inter = tf.config.threading.get_inter_op_parallelism_threads()
  return f"tf {intra}/{inter}"


def profile_one(impl: str, args) -> None:
  """Prints the op-time table of `args.steps` steps of a TF implementation."""
  import op_profile  # pylint: disable=g-import-not-at-top  (this folder)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  step, prepare = tf_step_with_threads(impl, args)
  batches = args_batches(args)
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


def add_child_arguments(
  parser: argparse.ArgumentParser, torch_sides: str
) -> None:
  """`--torch_python` (what `torch_python` reads; `torch_sides` says which
  sides it runs) and the hidden `--_child` a parent starts its children with."""
  parser.add_argument(
    "--torch_python",
    help=f"interpreter for {torch_sides} (default: "
    "$RECSYS_BENCH_TORCH_PYTHON, else this one)",
  )
  parser.add_argument("--_child", help=argparse.SUPPRESS)


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
  """The threading environment of a TF child on `intra` intra-op threads
  (`big_table_threads.py`'s children; this script's use `tf_env`).

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


TF_RIVALS = ("tfrs", "keras_embedding", "tf_fused")


def tf_env(intra: int, inter: int) -> dict[str, str]:
  """A TF child's thread variables. TF links no OpenMP (its oneDNN runs on
  TF's own pools), so the caller's OMP_* variables are left as they are."""
  return {
    "TF_NUM_INTRAOP_THREADS": str(intra),
    "TF_NUM_INTEROP_THREADS": str(inter),
    "TF_CPP_MIN_LOG_LEVEL": "3",
  }


def torch_env(threads: int) -> dict[str, str]:
  """A torch child's thread variables: torch's intra-op threads are
  OpenMP's (and MKL's). OMP_WAIT_POLICY is the caller's, PASSIVE when unset
  (spinning OpenMP threads starve the other core)."""
  return {
    "OMP_NUM_THREADS": str(threads),
    "MKL_NUM_THREADS": str(threads),
    "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
  }


def recsys_threads(args) -> list[tuple[int, int]]:
  """recsys's (intra-op, inter-op) settings: each `--intra_threads` value
  with `--inter_threads`, resolved as `recsys train` resolves its flags on
  this machine's cores (0 and 0: 1 / 2 on 2 cores or fewer); TF's default
  (0) is spelled out as the core count it stands for."""
  from recsys.process import threads as threads_lib  # pylint: disable=g-import-not-at-top  (no TF)

  cores = threads_lib.available_cores()
  settings = []
  for t in intra_settings(args):
    intra, inter, _ = threads_lib.thread_settings(t, args.inter_threads, cores)
    settings.append((intra or cores, inter or cores))
  return settings


def thread_variants(impl: str, args) -> list[tuple[int, ...]]:
  """The thread settings `impl` runs at: (threads,) for torch, (intra-op,
  inter-op) for TF. The rivals are swept (issue 46: each at its best);
  recsys runs as `recsys train` would (or as `--intra_threads` says). The
  TF rivals share recsys's inter-op threads (TF's default here, 2)."""
  if impl in TORCH_IMPLS:
    return [(t,) for t in race.thread_counts(args.torch_threads)]
  if impl in TF_RIVALS:
    inter = recsys_threads(args)[0][1]
    return [(t, inter) for t in race.thread_counts(args.tf_threads)]
  return list(recsys_threads(args))


_FIGURES = (
  "step_ms",
  "examples_per_s",
  "ids_per_s",
  "cpu_ms_per_step",
  "ids_per_cpu_s",
  "peak_rss_mb",
  "load",
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
  "table_dtype",
)


def child_command(
  impl: str, threads: tuple[int, ...], args, **point
) -> tuple[list[str], dict[str, str]]:
  """(command, environment) of a child running `impl` at `threads`;
  `point`: rows=, batch= (and profile=True for --profile)."""
  flags = [f"--{k}={getattr(args, k)}" for k in _CHILD_FLAGS]
  flags += [f"--{k}={v}" for k, v in point.items() if v is not True]
  flags += [f"--{k}" for k, v in point.items() if v is True]
  if impl in TORCH_IMPLS:
    flags.append(f"--torch_threads={threads[0]}")
    env = torch_env(threads[0])
  else:
    flags += [f"--intra_threads={threads[0]}", f"--inter_threads={threads[1]}"]
    env = tf_env(*threads)
  cmd = [python_for(impl, args), os.path.abspath(__file__), "--_child", impl]
  return cmd + flags, dict(os.environ, **env)


def run_child(
  impl: str,
  threads: tuple[int, ...],
  args,
  rows: str,
  batch: str,
  busy: int = 0,
) -> dict[str, Any] | None:
  """One timed run in a fresh process (None if it failed, with its error
  printed), beside `busy` processes each spinning on a core; `load` is the
  machine's 1-minute load average at its start."""
  cmd, env = child_command(impl, threads, args, rows=rows, batch=batch)
  load = race.load_average()[0]
  with race.spinning(busy):
    out = subprocess.run(
      cmd, capture_output=True, text=True, env=env, check=False
    )
  if out.returncode != 0:
    print(
      f"{impl} (rows={rows}, batch={batch}, threads={threads}) failed:\n"
      f"{out.stderr[-2000:]}",
      file=sys.stderr,
    )
    return None
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["load"] = load
  result["busy"] = busy
  beside = f", {busy} busy core(s) beside" if busy else ""
  print(
    f"  round: {impl:16s} rows={rows} batch={batch} {result['threads']:20s} "
    f"{result['ids_per_s'] / 1e6:.2f} M ids/s (load {load:.2f}{beside})",
    file=sys.stderr,
  )
  return result


def sweep(args, impls: list[str]) -> list[dict[str, Any]]:
  """Runs every (rows, batch) point: implementations and their thread
  settings interleaved, one run each per round. Rows are medians over
  rounds; `best` marks each implementation's best setting at its point."""
  results = []
  variants = [
    (impl, t, busy)
    for impl in impls
    for t in thread_variants(impl, args)
    for busy in busy_counts(args)
  ]
  for rows in args.rows.split(","):
    for batch in args.batch.split(","):
      runs: dict[tuple[str, tuple[int, ...], int], list[dict[str, Any]]] = {
        v: [] for v in variants
      }
      for _ in range(args.repeats):
        for impl, threads, busy in variants:
          got = run_child(impl, threads, args, rows, batch, busy)
          if got:
            runs[(impl, threads, busy)].append(got)
      for (impl, _, busy), done in runs.items():
        if not done:
          continue
        row: dict[str, Any] = {
          k: statistics.median(r[k] for r in done) for k in _FIGURES
        }
        row.update(
          impl=impl,
          rows=int(rows),
          batch=int(batch),
          threads=done[0]["threads"],
          busy=busy,
          runs=len(done),
          ids_per_s_each=[r["ids_per_s"] for r in done],  # for the spread
        )
        results.append(row)
  race.mark_best(results, _point_of, "ids_per_s")
  return results


def busy_counts(args) -> list[int]:
  """`--busy_cores` as a list: 0 is the machine as it is."""
  return [int(n) for n in str(args.busy_cores).split(",")]


def _point_of(row: dict[str, Any]) -> tuple[str, int, int, int]:
  return row["impl"], row["rows"], row["batch"], row["busy"]


def under_load(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Each setting measured beside busy cores against itself without them
  (the same rounds, interleaved): its loaded M ids/s over its quiet ones,
  as a ratio of medians and as the median of each round's ratio (the
  steadier one on a VM whose speed drifts between rounds)."""
  quiet = {
    (r["impl"], r["rows"], r["batch"], r["threads"]): r
    for r in results
    if r["busy"] == 0
  }
  out = []
  for r in results:
    base = quiet.get((r["impl"], r["rows"], r["batch"], r["threads"]))
    if r["busy"] and base:
      out.append(
        dict(
          r,
          quiet_ids_per_s=base["ids_per_s"],
          of_quiet=r["ids_per_s"] / base["ids_per_s"],
          of_quiet_paired=statistics.median(
            loaded / quiet
            for quiet, loaded in zip(
              base["ids_per_s_each"], r["ids_per_s_each"]
            )
          ),
        )
      )
  return out


def print_under_load(rows: list[dict[str, Any]]) -> None:
  """The loaded-over-quiet table (`--busy_cores` with a count above 0)."""
  if not rows:
    return
  print(
    "\nbeside busy cores (other processes spinning, `--busy_cores`) against "
    "the same setting on the machine as it was:"
  )
  tables.print_table(
    "implementation | rows | batch | threads | busy cores | M ids/s quiet "
    "| M ids/s loaded | of quiet | of quiet, per round | CPU ms/step loaded",
    (
      f"{r['impl']} | {r['rows']} | {r['batch']} | {r['threads']} | "
      f"{r['busy']} | {r['quiet_ids_per_s'] / 1e6:.2f} | "
      f"{r['ids_per_s'] / 1e6:.2f} | **{r['of_quiet']:.2f}x** | "
      f"{r['of_quiet_paired']:.2f}x | {r['cpu_ms_per_step']:.1f}"
      for r in rows
    ),
  )


def against_best(
  results: list[dict[str, Any]], impls: list[str]
) -> list[dict[str, Any]]:
  """The first implementation (at its best setting) against every other at
  its best: by wall time the setting of highest ids/s, per CPU-second the
  setting of highest ids per CPU-second (each named)."""
  out = []
  for rows, batch in dict.fromkeys((r["rows"], r["batch"]) for r in results):
    here = [r for r in results if (r["rows"], r["batch"]) == (rows, batch)]
    by_impl = {i: [r for r in here if r["impl"] == i] for i in impls}
    if not by_impl[impls[0]]:
      continue
    base = race.best(by_impl[impls[0]], "ids_per_s")
    base_cpu = race.best(by_impl[impls[0]], "ids_per_cpu_s")
    for impl in impls[1:]:
      wall = race.best(by_impl[impl], "ids_per_s")
      cpu = race.best(by_impl[impl], "ids_per_cpu_s")
      if not wall or not cpu:
        continue
      out.append(
        {
          "rows": rows,
          "batch": batch,
          "impl": impl,
          "base": impls[0],
          "base_threads": base["threads"],
          "best_threads": wall["threads"],
          "ids_per_s": wall["ids_per_s"],
          "base_is": base["ids_per_s"] / wall["ids_per_s"],
          "best_cpu_threads": cpu["threads"],
          "ids_per_cpu_s": cpu["ids_per_cpu_s"],
          "base_is_cpu": base_cpu["ids_per_cpu_s"] / cpu["ids_per_cpu_s"],
        }
      )
  return out


def print_table(results: list[dict[str, Any]]) -> None:
  """Every implementation at every thread setting; `best` marks its best
  setting at that point (highest ids/s), `of best` its ids/s over that."""
  tables.print_table(
    "implementation | rows | batch | threads | best | step ms | examples/s "
    "| M ids/s | of best | CPU ms/step | M ids per CPU-s | RSS MB | load",
    (
      f"{r['impl']} | {r['rows']} | {r['batch']} | {r['threads']} | "
      f"{'**best**' if r['best'] else ''} | "
      f"{r['step_ms']:.1f} | {r['examples_per_s']:.0f} | "
      f"{r['ids_per_s'] / 1e6:.2f} | {r['of_best']:.2f} | "
      f"{r['cpu_ms_per_step']:.1f} | {r['ids_per_cpu_s'] / 1e6:.2f} | "
      f"{r['peak_rss_mb']:.0f} | {r['load']:.1f}"
      for r in results
    ),
  )


def print_against_best(rows: list[dict[str, Any]]) -> None:
  """The ratios: the first implementation against each other's best."""
  if not rows:
    return
  base = rows[0]["base"]
  print(
    f"\n{base} ({rows[0]['base_threads']}) against each implementation at "
    "its best thread setting (by wall time: its highest M ids/s; per "
    "CPU-second: its highest M ids per CPU-s):"
  )
  tables.print_table(
    f"rows | batch | implementation | best threads | M ids/s | {base} is "
    f"| best threads per CPU-s | M ids per CPU-s | {base} is per CPU-s",
    (
      f"{r['rows']} | {r['batch']} | {r['impl']} | {r['best_threads']} | "
      f"{r['ids_per_s'] / 1e6:.2f} | **{r['base_is']:.2f}x** | "
      f"{r['best_cpu_threads']} | {r['ids_per_cpu_s'] / 1e6:.2f} | "
      f"**{r['base_is_cpu']:.2f}x**"
      for r in rows
    ),
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
  add_step_arguments(
    parser,
    table_dtype_help="recsys's table storage (tensorcore's table_dtype; narrow "
    "tables run on the fused kernels too); recsys_bf16 / recsys_fp16 always "
    "store bfloat16 / float16",
  )
  parser.add_argument(
    "--bag_width",
    type=int,
    default=0,
    help="static width recsys pads bags to (default: max_bag)",
  )
  parser.add_argument(
    "--index_shards",
    type=int,
    default=1,
    help="recsys_dynamic: each table's index in this many shards "
    "(DynamicVocabulary.shards)",
  )
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument(
    "--repeats",
    type=int,
    default=3,
    help="interleaved rounds (each implementation once per round)",
  )
  parser.add_argument(
    "--intra_threads",
    default="0",
    help="recsys's TF intra-op threads; 0: as `recsys train` chooses "
    "(1 on 2 cores or fewer); a comma-separated list sweeps settings, "
    "interleaved",
  )
  parser.add_argument(
    "--inter_threads",
    type=int,
    default=0,
    help="TF inter-op threads (recsys and the TF rivals); 0: as "
    "`recsys train` chooses (2 on 2 cores or fewer, else TF's default)",
  )
  parser.add_argument(
    "--tf_threads",
    default="1,2",
    help="TF intra-op threads of tfrs / keras_embedding / tf_fused, swept; "
    "each is compared at its best",
  )
  parser.add_argument(
    "--torch_threads",
    default="1,2",
    help="torch (OpenMP, MKL) threads of torch_bag / fbgemm / torchrec, "
    "swept; each is compared at its best",
  )
  parser.add_argument(
    "--busy_cores",
    default="0",
    help="also run each setting beside this many processes each spinning "
    "on a core (a comma list, interleaved with the others: 0,1 measures "
    "the step quiet and with one of the cores taken); the table "
    "'beside busy cores' gives loaded over quiet",
  )
  parser.add_argument(
    "--json", help="also write the results (and settings) here"
  )
  parser.add_argument(
    "--profile",
    action="store_true",
    help="instead of timing: the op-time table of each TF "
    "implementation (TF profiler, --steps steps) at its first setting",
  )
  add_child_arguments(parser, "torch_bag/fbgemm/torchrec")
  args = parser.parse_args(argv)

  if args._child:  # pylint: disable=protected-access
    args.rows, args.batch = int(args.rows), int(args.batch)
    args.intra_threads = intra_settings(args)[0]
    args.torch_threads = race.thread_counts(args.torch_threads)[0]
    if args.profile:
      profile_one(args._child, args)  # pylint: disable=protected-access
      return
    print(json.dumps(run_one(args._child, args)))  # pylint: disable=protected-access
    return

  impls = available_impls(parser, args)
  settings = {
    "machine": f"{race.cpu_model()}, {platform.machine()}, "
    f"{os.cpu_count()} cpus, Python {platform.python_version()}",
    "threads": {
      impl: [" / ".join(map(str, t)) for t in thread_variants(impl, args)]
      for impl in impls
    },
    "threads_are": "TF: intra-op / inter-op; torch: torch = OMP = MKL",
    "OMP_WAIT_POLICY (torch)": torch_env(1)["OMP_WAIT_POLICY"],
    "features": args.features,
    "dim": args.dim,
    "max_bag": args.max_bag,
    "bag_width": args.bag_width or args.max_bag,
    "zipf": args.zipf,
    "index_shards": args.index_shards,
    "steps": args.steps,
    "warmup": args.warmup,
    "repeats": args.repeats,
    "busy_cores": busy_counts(args),
  }
  print("settings: " + json.dumps(settings))
  print(race.machine_state("before"), flush=True)
  if args.profile:
    profile(args, impls)
    return
  results = sweep(args, impls)
  quiet = [r for r in results if r["busy"] == 0]
  summary = against_best(quiet, impls)
  loaded = under_load(results)
  print(race.machine_state("after"))
  print_table(quiet)
  print_against_best(summary)
  print_under_load(loaded)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {
          "settings": settings,
          "results": results,
          "against_best": summary,
          "under_load": loaded,
        },
        f,
        indent=1,
      )


def available_impls(parser: argparse.ArgumentParser, args) -> list[str]:
  """`--impls` whose packages are installed (a line for each skipped)."""
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
  return impls


def profile(args, impls: list[str]) -> None:
  """`--profile`: each TF implementation's op-time table, at its first
  thread setting, in a child of its own."""
  for impl in impls:
    if impl in TORCH_IMPLS:
      print(f"\n{impl}: --profile covers the TF implementations only")
      continue
    cmd, env = child_command(
      impl,
      thread_variants(impl, args)[0],
      args,
      rows=args.rows.split(",")[0],
      batch=args.batch.split(",")[0],
      profile=True,
    )
    subprocess.run(cmd, env=env, check=False)


if __name__ == "__main__":
  main()
