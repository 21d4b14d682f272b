"""End-to-end DLRM training step: recsys against TorchRec, same model and data.

Both sides train the same DLRM: categorical features with their own tables
(sum-pooled bags), a bottom MLP on the dense features ending in the embedding
dim, the pairwise dot interaction (no self-interaction), a top MLP ending in
one logit, binary cross-entropy; Adam on the dense layers, exact Adagrad
(initial accumulator 0.1) on the tables. The batches are generated once
(`embedding_step.make_batches`, Zipf ids, bags of 1..max ids, plus normal
dense features and random labels) and fed to both from memory.

  recsys    backends.create("tensorcore") with padded bags (what the trainer
            feeds; `preprocess` done once per distinct batch, untimed),
            `recsys.models.DLRM` on the batch slices the Trainer picks
            (`--batch_slices`), `--loop` steps per tf.function call as the
            Trainer's compiled loop runs them
  torchrec  TorchRec FusedEmbeddingBagCollection (fused exact Adagrad) +
            torch MLPs, dot interaction and torch.optim.Adam, eager

Each side runs in its own process (peak RSS is that process's ru_maxrss;
`--memory` prints its RSS after each phase: imports, tables, batches, first
step, warm-up, timed steps),
interleaved over `--repeats` rounds, with deliberate thread settings. Per
side and thread setting: examples/s (median over rounds of each run's
median), CPU-seconds per step (process CPU time / steps: 2 busy threads give
2x wall time), peak RSS; then recsys against TorchRec at TorchRec's best
setting (issue 46: a fair race).

Threads (printed, with the machine's load and its other busy processes
before and after the runs):
  recsys    TF intra-op / inter-op threads as `recsys train` chooses them
            here (1 / 2 on 2 cores or fewer, else TF's defaults), or
            `--intra_threads` (a comma list sweeps) / `--inter_threads`
  torchrec  torch.set_num_threads = OMP_NUM_THREADS = MKL_NUM_THREADS swept
            over `--torch_threads` (default 1,2): on this project's 2 cores
            its eager step is fastest on one thread
TF links no OpenMP, so OMP_NUM_THREADS / OMP_WAIT_POLICY matter to the torch
side only (OMP_WAIT_POLICY: the caller's, PASSIVE when unset).

Configurations (`--config`):
  default   the default experiment's shape (experiments/synthetic_dlrm.gin):
            8 tables of 100..10,000 rows x 16, bags of up to 1,1,1,1,1,1,3,5
            ids, 13 dense, bottom (64, 16), top (128, 64), batch 1024
  heavy     8 tables x 200,000 x 32, bags of 1..8 ids, 13 dense,
            bottom (64, 32), top (128, 64), batch 2048

    python benchmarks/dlrm_vs_torchrec.py --config default,heavy --repeats 3

TorchRec comes from the `bench` extra (`make bench` installs it); without
torch / fbgemm_gpu / torchrec that side is skipped with a line.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embedding_step  # noqa: E402  (this folder: batches, thread settings)
import race  # noqa: E402  (this folder: machine state, best settings)
import tables  # noqa: E402  (this folder: Markdown tables)

CONFIGS: dict[str, dict[str, Any]] = {
  "default": dict(
    vocab=(1000, 200, 5000, 10000, 100, 3000, 800, 2000),
    max_bag=(1, 1, 1, 1, 1, 1, 3, 5),
    dim=16,
    num_dense=13,
    bottom=(64, 16),
    top=(128, 64),
    batch=1024,
  ),
  "heavy": dict(
    vocab=(200_000,) * 8,
    max_bag=(8,) * 8,
    dim=32,
    num_dense=13,
    bottom=(64, 32),
    top=(128, 64),
    batch=2048,
  ),
}
SIDES = ("recsys", "torchrec")


def _python(side: str, args) -> str:
  """The interpreter of `side`'s children (torch may live in its own venv)."""
  return (
    embedding_step.torch_python(args) if side == "torchrec" else sys.executable
  )


_MEMORY: list[dict[str, Any]] = []  # this child's phases (--memory)


def mark(phase: str) -> None:
  """Records the process's RSS (MB) after `phase`: total, its anonymous part
  (heap, tables, arenas: what the process allocated) and its file part
  (mapped shared-library pages, shared with other processes), and the peak."""
  rss = {}
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      key = line.split(":")[0]
      if key in ("VmRSS", "RssAnon", "RssFile"):
        rss[key] = int(line.split()[1]) / 1024
  _MEMORY.append(
    {
      "phase": phase,
      "rss_mb": rss["VmRSS"],
      "anon_mb": rss["RssAnon"],
      "file_mb": rss["RssFile"],
      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
  )


DENSE_LR, TABLE_LR, INITIAL_ACCUMULATOR = 0.003, 0.05, 0.1


def make_data(cfg: dict[str, Any], num_batches: int, seed: int) -> list[dict]:
  """Batches: {"ids": {f: (ids [N], lengths [B])}, "dense": [B, 13],
  "labels": [B]}."""
  per_feature = [
    embedding_step.make_batches(
      num_batches, cfg["batch"], 1, rows, bag, zipf=1.05, seed=seed + 101 * f
    )
    for f, (rows, bag) in enumerate(zip(cfg["vocab"], cfg["max_bag"]))
  ]
  rng = np.random.default_rng(seed)
  return [
    {
      "ids": {
        f"f{f}": per_feature[f][i]["f0"] for f in range(len(cfg["vocab"]))
      },
      "dense": rng.normal(size=(cfg["batch"], cfg["num_dense"])).astype(
        np.float32
      ),
      "labels": rng.integers(0, 2, cfg["batch"]).astype(np.float32),
    }
    for i in range(num_batches)
  ]


def _recsys(cfg, data, args):
  """(run(steps) -> None, sync) for the recsys side."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import backends  # pylint: disable=g-import-not-at-top
  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from recsys.feature_spec import FeatureSpec  # pylint: disable=g-import-not-at-top
  from recsys.models.base import replica_loss  # pylint: disable=g-import-not-at-top
  from recsys.models.dlrm import DLRM  # pylint: disable=g-import-not-at-top
  from recsys.models.loss_inputs import LossInputs  # pylint: disable=g-import-not-at-top
  from recsys.training import batch_slices  # pylint: disable=g-import-not-at-top

  mark("import recsys + TF")
  tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
  E = tf.tpu.experimental.embedding
  names = list(data[0]["ids"])
  config = {
    n: E.FeatureConfig(E.TableConfig(v, cfg["dim"], combiner="sum", name=n))
    for n, v in zip(names, cfg["vocab"])
  }
  emb = backends.create(
    config,
    E.Adagrad(TABLE_LR, initial_accumulator_value=INITIAL_ACCUMULATOR),
    backend="tensorcore",
    bag_widths=max(cfg["max_bag"]),
  )
  emb.build()
  mark("tables + slots built")
  specs = [
    FeatureSpec(n, v, multi_hot=b > 1, max_ids=b)
    for n, v, b in zip(names, cfg["vocab"], cfg["max_bag"])
  ]
  model = DLRM(
    specs,
    num_dense=cfg["num_dense"],
    bottom_mlp=cfg["bottom"],
    top_mlp=cfg["top"],
    self_interaction=False,
  )
  # The dense part on the batch slices the Trainer picks here (or as set).
  slices = batch_slices.resolve(
    args.batch_slices or None,
    model,
    tf.distribute.get_strategy(),
    False,
    cfg["batch"],
  ).slices

  def loss_of(acts, features, labels):
    return replica_loss(
      model,
      batch_slices.per_example_loss(
        model, LossInputs(acts, features, labels), slices
      ),
      cfg["batch"],
    )

  dense_opt = tf.keras.optimizers.Adam(DENSE_LR)
  lookup = tf.autograph.experimental.do_not_convert(emb.lookup)
  apply = tf.autograph.experimental.do_not_convert(emb.apply_gradients)

  # The distinct batches stacked (padded bags have static shapes), so one
  # tf.function call runs `--loop` steps over them like the trainer's loop.
  prepared = [
    emb.preprocess(
      {n: tf.RaggedTensor.from_row_lengths(*b["ids"][n]) for n in names}
    )[0]
    for b in data
  ]
  stacked = tf.nest.map_structure(lambda *xs: tf.stack(xs), *prepared)
  dense = tf.constant(np.stack([b["dense"] for b in data]))
  labels = tf.constant(np.stack([b["labels"] for b in data]))
  count = len(data)
  mark("batches padded + stacked")

  def one_step(i):
    ids = tf.nest.map_structure(lambda x: x[i % count], stacked)
    features = {"dense": dense[i % count]}
    with tf.GradientTape() as tape:
      acts = lookup(ids, training=True)
      tape.watch(acts)
      loss = loss_of(acts, features, labels[i % count])
    grads, act_grads = tape.gradient(loss, (model.trainable_variables, acts))
    dense_opt.apply_gradients(zip(grads, model.trainable_variables))
    apply(act_grads)
    return loss

  one_step(tf.constant(0))  # builds the model's variables
  mark("first eager step (model built)")
  counter = tf.Variable(0)

  # The step split: each part alone in the same compiled loop, so the loop's
  # own cost is in each (and the parts add up to a little more than a step).
  # input: the batch slices only; embedding: lookup + Adagrad update with a
  # fixed activation gradient; dense: the model's forward, backward and Adam
  # on fixed activations.
  fixed_acts = lookup(tf.nest.map_structure(lambda x: x[0], stacked))
  fixed_grads = tf.nest.map_structure(tf.ones_like, fixed_acts)

  def input_part(i):
    ids = tf.nest.map_structure(lambda x: x[i % count], stacked)
    return tf.add_n(
      [tf.cast(tf.reduce_sum(x), tf.float32) for x in tf.nest.flatten(ids)]
      + [dense[i % count][0, 0], labels[i % count][0]]
    )

  def embedding_part(i):
    ids = tf.nest.map_structure(lambda x: x[i % count], stacked)
    acts = lookup(ids, training=True)
    apply(fixed_grads)
    return tf.add_n([a[0, 0] for a in tf.nest.flatten(acts)])

  def dense_part(i):
    with tf.GradientTape() as tape:
      loss = loss_of(fixed_acts, {"dense": dense[i % count]}, labels[i % count])
    grads = tape.gradient(loss, model.trainable_variables)
    dense_opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  def looped(body):
    @tf.function
    def loop_fn(n):
      out = tf.constant(0.0)
      for _ in tf.range(n):
        out = body(counter.assign_add(1))
      return out

    def run_fn(steps):
      done = 0
      while done < steps:
        k = min(args.loop, steps - done)
        loop_fn(tf.constant(k)).numpy()
        done += k

    return run_fn

  return {
    "step": looped(one_step),
    "embedding": looped(embedding_part),
    "dense": looped(dense_part),
    "input": looped(input_part),
    "batch_slices": slices,
  }


def _torchrec(cfg, data, args):
  """run(steps) for the TorchRec side: the same DLRM in torch, eager."""
  # pylint: disable=g-import-not-at-top
  import torch
  from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
  from torchrec.modules.fused_embedding_modules import (
    FusedEmbeddingBagCollection,
  )
  from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

  mark("import torch + torchrec")
  torch.set_num_threads(args.torch_threads)
  torch.manual_seed(args.seed)
  names = list(data[0]["ids"])
  dim = cfg["dim"]
  ebc = FusedEmbeddingBagCollection(
    tables=[
      EmbeddingBagConfig(
        name=f"t_{n}",
        embedding_dim=dim,
        num_embeddings=v,
        feature_names=[n],
        pooling=PoolingType.SUM,
      )
      for n, v in zip(names, cfg["vocab"])
    ],
    optimizer_type=torch.optim.Adagrad,
    optimizer_kwargs={"lr": TABLE_LR},
    device=torch.device("cpu"),
  )
  # FBGEMM's exact Adagrad starts its accumulators at 0 and takes no initial
  # value: set them as recsys starts its slots (eps 1e-8 keeps them apart).
  with torch.no_grad():
    for module in ebc._emb_modules:  # pylint: disable=protected-access
      for states in module._emb_module.split_optimizer_states():  # pylint: disable=protected-access
        for state in states:
          state.fill_(INITIAL_ACCUMULATOR)

  def mlp(sizes, last_relu):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
      layers.append(torch.nn.Linear(a, b))
      if last_relu or i < len(sizes) - 2:
        layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)

  num_vectors = len(names) + 1
  pairs = num_vectors * (num_vectors - 1) // 2
  bottom = mlp((cfg["num_dense"],) + tuple(cfg["bottom"]), last_relu=True)
  top = mlp((dim + pairs,) + tuple(cfg["top"]) + (1,), last_relu=False)
  mark("tables + slots built")
  dense_params = list(bottom.parameters()) + list(top.parameters())
  dense_opt = torch.optim.Adam(dense_params, lr=DENSE_LR)
  rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
  bce = torch.nn.BCEWithLogitsLoss()

  inputs = []
  for b in data:
    kjt = KeyedJaggedTensor.from_lengths_sync(
      keys=names,
      values=torch.from_numpy(np.concatenate([b["ids"][n][0] for n in names])),
      lengths=torch.from_numpy(np.concatenate([b["ids"][n][1] for n in names])),
    )
    inputs.append(
      (kjt, torch.from_numpy(b["dense"]), torch.from_numpy(b["labels"]))
    )
  state = {"i": 0}
  mark("batches converted")

  def one_step():
    kjt, dense, labels = inputs[state["i"] % len(inputs)]
    state["i"] += 1
    pooled = ebc(kjt).values().view(-1, len(names), dim)  # [B, F, D]
    x = bottom(dense)  # [B, D]
    vectors = torch.cat([x.unsqueeze(1), pooled], dim=1)  # [B, F+1, D]
    dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, rows, cols]
    logits = top(torch.cat([x, dots], dim=1)).squeeze(1)
    loss = bce(logits, labels)
    dense_opt.zero_grad()
    loss.backward()  # the tables update inside (fused Adagrad)
    dense_opt.step()
    return float(loss.detach())

  # The step split (see _recsys): input = the batch fetched, embedding =
  # pooled lookup + backward (the fused Adagrad update) with a fixed gradient,
  # dense = bottom/interaction/top + Adam on fixed pooled activations.
  with torch.no_grad():
    fixed_pooled = ebc(inputs[0][0]).values().view(-1, len(names), dim)
  fixed_grad = torch.ones(len(data[0]["labels"]), len(names) * dim)

  def input_part():
    kjt, dense, labels = inputs[state["i"] % len(inputs)]
    state["i"] += 1
    return float(dense[0, 0]) + float(labels[0]) + len(kjt.values())

  def embedding_part():
    kjt = inputs[state["i"] % len(inputs)][0]
    state["i"] += 1
    pooled = ebc(kjt).values()
    pooled.backward(fixed_grad)
    return float(pooled[0, 0].detach())

  def dense_part():
    _, dense, labels = inputs[state["i"] % len(inputs)]
    state["i"] += 1
    x = bottom(dense)
    vectors = torch.cat([x.unsqueeze(1), fixed_pooled], dim=1)
    dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, rows, cols]
    logits = top(torch.cat([x, dots], dim=1)).squeeze(1)
    loss = bce(logits, labels)
    dense_opt.zero_grad()
    loss.backward()
    dense_opt.step()
    return float(loss.detach())

  def looped(body):
    def run_fn(steps):
      for _ in range(steps):
        body()

    return run_fn

  return {
    "step": looped(one_step),
    "embedding": looped(embedding_part),
    "dense": looped(dense_part),
    "input": looped(input_part),
  }


def run_child(side: str, args) -> dict[str, Any]:
  """Times one side in this process."""
  mark("python + numpy")
  cfg = CONFIGS[args.config]
  data = make_data(cfg, args.distinct_batches, args.seed)
  mark("batches generated")
  parts = (_recsys if side == "recsys" else _torchrec)(cfg, data, args)
  slices = parts.pop("batch_slices", None)
  threads = _threads_seen(side)
  if slices:
    threads += f", {slices} batch slice{'s' if slices > 1 else ''}"
  run = parts["step"]
  run(args.warmup)
  mark("warm-up steps (traced)")
  wall, cpu = _time(run, args)
  step = statistics.median(wall)
  mark("timed steps")
  result: dict[str, Any] = {
    "side": side,
    "threads": threads,
    "batch_slices": slices,
    "step_ms": step * 1e3,
    "examples_per_s": cfg["batch"] / step,
    "cpu_ms_per_step": statistics.median(cpu) * 1e3,
    # The whole step's peak: the split below builds more graphs.
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }
  if args.split:
    for name in ("embedding", "dense", "input"):
      parts[name](args.warmup)
      part_wall, part_cpu = _time(parts[name], args)
      result[f"{name}_ms"] = statistics.median(part_wall) * 1e3
      result[f"{name}_cpu_ms"] = statistics.median(part_cpu) * 1e3
  result["memory"] = _MEMORY
  return result


def _threads_seen(side: str) -> str:
  """The child's thread settings as its framework reports them."""
  if side == "recsys":
    return embedding_step.tf_threads_seen()
  return embedding_step.torch_threads_seen()


def _time(run, args) -> tuple[list[float], list[float]]:
  """Per-step wall and process-CPU seconds of `--reps` runs of `--steps`."""
  wall, cpu = [], []
  for _ in range(args.reps):
    start, start_cpu = time.perf_counter(), time.process_time()
    run(args.steps)
    wall.append((time.perf_counter() - start) / args.steps)
    cpu.append((time.process_time() - start_cpu) / args.steps)
  return wall, cpu


_CHILD_FLAGS = (
  "seed",
  "warmup",
  "steps",
  "reps",
  "loop",
  "distinct_batches",
  "split",
  "batch_slices",
)

Variant = tuple[str, tuple[int, ...]]  # (side, threads)


def variants(sides: list[str], args) -> list[Variant]:
  """Each side at each of its thread settings: recsys's (intra-op,
  inter-op) as `recsys train` resolves them, TorchRec's (threads,) swept."""
  out: list[Variant] = []
  for side in sides:
    if side == "recsys":
      out += [(side, t) for t in embedding_step.recsys_threads(args)]
    else:
      out += [(side, (t,)) for t in race.thread_counts(args.torch_threads)]
  return out


def run_variant(variant: Variant, config: str, args) -> dict[str, Any] | None:
  """One timed run of `variant` in a fresh process (None if it failed, with
  its error printed); `load` is the 1-minute load average at its start."""
  side, threads = variant
  cmd = [
    _python(side, args),
    os.path.abspath(__file__),
    "--_child",
    side,
    f"--config={config}",
  ] + [f"--{k}={getattr(args, k)}" for k in _CHILD_FLAGS]
  if side == "recsys":
    cmd += [f"--intra_threads={threads[0]}", f"--inter_threads={threads[1]}"]
    env = dict(os.environ, **embedding_step.tf_env(*threads))
  else:
    cmd.append(f"--torch_threads={threads[0]}")
    env = dict(os.environ, **embedding_step.torch_env(threads[0]))
  load = race.load_average()[0]
  out = subprocess.run(
    cmd, capture_output=True, text=True, env=env, check=False
  )
  if out.returncode != 0:
    print(
      f"{side} {threads} ({config}) failed:\n{out.stderr[-2000:]}",
      file=sys.stderr,
    )
    return None
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["load"] = load
  print(
    f"  round: {config} {side:9s} {result['threads']:20s} "
    f"{result['examples_per_s']:.0f} examples/s (load {load:.2f})",
    file=sys.stderr,
  )
  return result


def run_config(config: str, todo: list[Variant], args) -> tuple[list, list]:
  """`--repeats` interleaved rounds of every variant on `config`: (rows of
  medians, [(config, side, threads, memory phases of its first run)])."""
  runs: dict[Variant, list[dict[str, Any]]] = {v: [] for v in todo}
  memories = []
  for _ in range(args.repeats):
    for variant in todo:
      got = run_variant(variant, config, args)
      if not got:
        continue
      runs[variant].append(got)
      if len(runs[variant]) == 1:
        memories.append((config, variant[0], got["threads"], got["memory"]))
  rows = []
  for (side, _), done in runs.items():
    if not done:
      continue
    keys = [
      k
      for k in done[0]
      if k not in ("side", "threads", "memory", "batch_slices")
    ]
    row: dict[str, Any] = {
      k: statistics.median(r[k] for r in done) for k in keys
    }
    row.update(config=config, side=side, threads=done[0]["threads"])
    row["runs"] = len(done)
    row["examples_per_s_each"] = [r["examples_per_s"] for r in done]
    row["examples_per_cpu_s"] = cfg_batch(config) / (
      row["cpu_ms_per_step"] / 1e3
    )
    rows.append(row)
  race.mark_best(rows, lambda r: r["side"], "examples_per_s")
  return rows, memories


def against_best(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """recsys at its best setting against TorchRec at its best, per config:
  by wall time the settings of highest examples/s, per CPU-second those of
  highest examples per CPU-second (each named)."""
  out = []
  for config in dict.fromkeys(r["config"] for r in results):
    here = [r for r in results if r["config"] == config]
    mine = [r for r in here if r["side"] == "recsys"]
    theirs = [r for r in here if r["side"] == "torchrec"]
    if not mine or not theirs:
      continue
    base, rival = (
      race.best(mine, "examples_per_s"),
      race.best(theirs, "examples_per_s"),
    )
    base_cpu, rival_cpu = (
      race.best(mine, "examples_per_cpu_s"),
      race.best(theirs, "examples_per_cpu_s"),
    )
    out.append(
      {
        "config": config,
        "recsys_threads": base["threads"],
        "recsys_examples_per_s": base["examples_per_s"],
        "torchrec_threads": rival["threads"],
        "torchrec_examples_per_s": rival["examples_per_s"],
        "recsys_is": base["examples_per_s"] / rival["examples_per_s"],
        "torchrec_cpu_threads": rival_cpu["threads"],
        "recsys_is_cpu": base_cpu["examples_per_cpu_s"]
        / rival_cpu["examples_per_cpu_s"],
        "recsys_peak_rss_mb": base["peak_rss_mb"],
        "torchrec_peak_rss_mb": rival["peak_rss_mb"],
      }
    )
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--config",
    default="default",
    help=f"comma-separated, from {', '.join(CONFIGS)}",
  )
  parser.add_argument("--sides", default=",".join(SIDES))
  parser.add_argument(
    "--repeats", type=int, default=3, help="interleaved rounds"
  )
  parser.add_argument(
    "--steps", type=int, default=100, help="steps per timed rep"
  )
  parser.add_argument("--reps", type=int, default=3, help="timed reps per run")
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument(
    "--loop",
    type=int,
    default=100,
    help="recsys steps per tf.function call (the trainer's steps_per_loop)",
  )
  parser.add_argument("--distinct_batches", type=int, default=8)
  parser.add_argument(
    "--batch_slices",
    type=int,
    default=0,
    help="recsys's dense part on this many batch slices side by side "
    "(train.batch_slices); 0: as `recsys train` picks it here",
  )
  parser.add_argument(
    "--split",
    type=int,
    default=1,
    help="1: also time the step's parts (embedding / dense / input)",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--intra_threads",
    default="0",
    help="recsys's TF intra-op threads; 0: as `recsys train` chooses (1 on "
    "2 cores or fewer); a comma-separated list sweeps settings",
  )
  parser.add_argument(
    "--inter_threads",
    type=int,
    default=0,
    help="recsys's TF inter-op threads; 0: as `recsys train` chooses",
  )
  parser.add_argument(
    "--torch_threads",
    default="1,2",
    help="TorchRec's torch (OpenMP, MKL) threads, swept; recsys is "
    "compared with its best",
  )
  parser.add_argument("--json", help="also write the results here")
  parser.add_argument(
    "--memory",
    action="store_true",
    help="also print each side's RSS after each phase (first round)",
  )
  embedding_step.add_child_arguments(parser, "the torchrec side")
  args = parser.parse_args(argv)
  if args._child:  # pylint: disable=protected-access
    args.intra_threads = embedding_step.intra_settings(args)[0]
    args.torch_threads = race.thread_counts(args.torch_threads)[0]
    print(json.dumps(run_child(args._child, args)))  # pylint: disable=protected-access
    return

  todo = variants(available_sides(parser, args), args)
  print(
    "settings: "
    + json.dumps(
      {
        "threads": {
          side: [" / ".join(map(str, t)) for s, t in todo if s == side]
          for side in dict.fromkeys(s for s, _ in todo)
        },
        "threads_are": "recsys: TF intra-op / inter-op; torchrec: "
        "torch = OMP = MKL",
        "OMP_WAIT_POLICY (torch)": embedding_step.torch_env(1)[
          "OMP_WAIT_POLICY"
        ],
        "steps": args.steps,
        "reps": args.reps,
        "repeats": args.repeats,
        "loop": args.loop,
      }
    )
  )
  print(race.machine_state("before"), flush=True)
  results, memories = [], []
  for config in args.config.split(","):
    if config not in CONFIGS:
      parser.error(
        f"unknown config {config!r}; choose from {', '.join(CONFIGS)}"
      )
    rows, memory = run_config(config, todo, args)
    results += rows
    memories += memory
  summary = against_best(results)
  print(race.machine_state("after"))
  print_results(results)
  print_against_best(summary)
  print_split(results)
  if args.memory:
    print_memory(memories)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"results": results, "against_best": summary}, f, indent=1)


def available_sides(parser: argparse.ArgumentParser, args) -> list[str]:
  """`--sides` whose packages are installed (a line for each skipped)."""
  sides = []
  for side in args.sides.split(","):
    if side not in SIDES:
      parser.error(f"unknown side {side!r}; choose from {', '.join(SIDES)}")
    missing = embedding_step.missing_packages(side, _python(side, args))
    if missing:
      print(
        f"skipping {side}: package(s) {', '.join(missing)} not installed "
        "(make bench, or pip install -e '.[bench]' then "
        "pip install --no-deps torchrec==1.8.0)"
      )
    else:
      sides.append(side)
  return sides


def print_results(results: list[dict[str, Any]]) -> None:
  """Every side at every thread setting; `best` marks each side's best
  (highest examples/s), `of best` its examples/s over that one's."""
  tables.print_table(
    "config | side | threads | best | examples/s | step ms | CPU ms/step | "
    "examples per CPU-s | of best | peak RSS MB | load",
    (
      f"{r['config']} | {r['side']} | {r['threads']} | "
      f"{'**best**' if r['best'] else ''} | {r['examples_per_s']:.0f} | "
      f"{r['step_ms']:.2f} | {r['cpu_ms_per_step']:.2f} | "
      f"{r['examples_per_cpu_s']:.0f} | {r['of_best']:.2f} | "
      f"{r['peak_rss_mb']:.0f} | {r['load']:.1f}"
      for r in results
    ),
  )


def print_against_best(summary: list[dict[str, Any]]) -> None:
  """The ratios: recsys's best against TorchRec's best, per config."""
  if not summary:
    return
  print(
    "\nrecsys against TorchRec at TorchRec's best thread setting (by wall "
    "time: its highest examples/s; per CPU-second: its highest examples per "
    "CPU-s); peak RSS of the wall-time best runs:"
  )
  tables.print_table(
    "config | recsys threads | recsys examples/s | TorchRec best threads | "
    "TorchRec examples/s | recsys is | TorchRec best per CPU-s | "
    "recsys is per CPU-s | peak RSS MB recsys / TorchRec",
    (
      f"{s['config']} | {s['recsys_threads']} | "
      f"{s['recsys_examples_per_s']:.0f} | {s['torchrec_threads']} | "
      f"{s['torchrec_examples_per_s']:.0f} | **{s['recsys_is']:.2f}x** | "
      f"{s['torchrec_cpu_threads']} | **{s['recsys_is_cpu']:.2f}x** | "
      f"{s['recsys_peak_rss_mb']:.0f} / {s['torchrec_peak_rss_mb']:.0f}"
      for s in summary
    ),
  )


def print_split(results: list[dict[str, Any]]) -> None:
  """The step's parts, each timed alone (`--split 1`)."""
  if not any("embedding_ms" in r for r in results):
    return
  print(
    "\nstep split, each part alone (ms per step wall / CPU):\n"
    "| config | side | threads | step | embedding | dense | input |\n"
    "|---|---|---|---|---|---|---|"
  )
  for r in results:
    if "embedding_ms" in r:
      print(
        f"| {r['config']} | {r['side']} | {r['threads']} | "
        f"{r['step_ms']:.2f} / {r['cpu_ms_per_step']:.2f} | "
        + " | ".join(
          f"{r[p + '_ms']:.2f} / {r[p + '_cpu_ms']:.2f}"
          for p in ("embedding", "dense", "input")
        )
        + " |"
      )


def print_memory(memories: list) -> None:
  """`--memory`: each variant's RSS after each phase of its first run."""
  for config, side, threads, memory in memories:
    print(f"\n{config} / {side} ({threads}): RSS after each phase (MB)")
    print("| phase | RSS | anon | file | peak |\n|---|---|---|---|---|")
    for m in memory:
      print(
        f"| {m['phase']} | {m['rss_mb']:.0f} | {m['anon_mb']:.0f} | "
        f"{m['file_mb']:.0f} | {m['peak_mb']:.0f} |"
      )


def cfg_batch(config: str) -> int:
  return int(CONFIGS[config]["batch"])


if __name__ == "__main__":
  main()
