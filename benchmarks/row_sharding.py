"""A DLRM with its largest tables row-sharded over the replicas vs replicated.

Builds the Trainer of a gin file (default: `experiments/synthetic_dlrm.gin`,
the `make demo` DLRM) on R logical CPU replicas of this process, once with
every table replicated and once with its `--shard_largest` largest tables
row-sharded (each layout in `--layouts`), and reports, in one run:

  step time      the whole train step (lookup and exchange, DLRM, losses,
                 dense Adam, embedding update) on one cached global batch,
                 `--loop` steps per tf.function call as the trainer runs
                 them, the placements timed interleaved; median ms, examples/s
                 and the ratio to replicated
  bytes/replica  the tables and slots one replica holds, measured on its
                 variables (and the planner's figure)
  exchange/step  what one replica puts into collectives per step
                 (`backends.placement`: ids, rows of row-sharded tables, row
                 gradients), from the batch's static number of ids
  collectives    what one replica puts into collectives in one traced
                 train step (every op, the dense gradients' all-reduce too)
  owner balance  per row layout, the most distinct rows one replica owns in
                 a step over the mean (1.0: even), from the batch's ids

Row-sharded runs: each of `--layouts` x `--exchanges` (all_to_all,
all_gather); `--per_replica_batch` fixes each replica's batch, so the
exchange per replica can be compared across replica counts.

With `--budget` it also runs the DLRM under a per-device memory budget that
its tables exceed twice: the planner refuses it on one replica (replicated)
and trains it row-sharded on R replicas (a few steps, placement chosen by
the planner).

    python benchmarks/row_sharding.py [--replicas 2] [--shard_largest 4] \\
        [--layouts contiguous] [--exchanges all_to_all,all_gather] \\
        [--per_replica_batch 512] [--loop 10] [--reps 5] \\
        [--budget [--budget_steps 20]] [--gin_bindings '...']

Timings on a shared machine are noisy: quote medians and the ratios of one
run, with the CPU model.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gin  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: E402,F401  (Keras 2 before TensorFlow)
import recsys.training.train  # noqa: E402,F401
from backends import optimizers as embedding_optimizers  # noqa: E402
from backends import placement as placement_lib  # noqa: E402
from backends.storage import row_layout  # noqa: E402
from recsys import config as config_lib  # noqa: E402
from recsys import planning  # noqa: E402
from recsys.process import threads  # noqa: E402
from recsys.run import strategy as strategy_lib  # noqa: E402

train_lib = sys.modules["recsys.training.train"]


def _trainer(strategy, placement, bindings=()):
  gin.clear_config()
  config_lib.parse(
    [ARGS.gin_file],
    [
      "train.progress_bar = False",
      "train.summaries = False",
      *ARGS.gin_bindings,
      *bindings,
    ],
  )
  return train_lib.train(
    model_dir=tempfile.mkdtemp(),
    action="build",
    strategy=strategy,
    placement=placement,
  )


def _replica_bytes(backend) -> int:
  """Bytes of the tables and slots on the first replica's device."""
  total = 0
  variables = list(backend.embedding_tables.values())
  for slots in backend.slot_variables().values():
    variables += list(slots.values())
  for var in variables:
    # A mirrored table's copy, or a row-sharded table's shard (`.shards`).
    local = getattr(var, "shards", var).values[0]
    total += local.shape.num_elements() * local.dtype.size
  return total


def _time_steps(trainer, batch):
  """A timer of `--loop` steps per call, and the traced loop's graph (one
  train step in its body: what `collective_bytes` reads)."""
  strategy, steps = trainer.run.strategy, trainer.steps

  @tf.function
  def run(n):
    for _ in tf.range(n):
      strategy.run(steps.train_step, args=(batch,))

  n = tf.constant(ARGS.loop)
  run(n)  # trace and warm up

  def once():
    """(wall ms, process CPU ms) per step."""
    start, cpu = time.perf_counter(), time.process_time()
    run(n)
    return (
      (time.perf_counter() - start) / ARGS.loop * 1e3,
      (time.process_time() - cpu) / ARGS.loop * 1e3,
    )

  return once, run.get_concrete_function(n).graph


def _owner_balance(batch, trainer, layout_name, replicas) -> float:
  """Max over mean of the distinct rows each replica owns in the batch."""
  counts = np.zeros(replicas)
  features = batch[0]["categorical"]
  for table in trainer.backend.tables:
    ids = []
    for path, feature in trainer.backend.feature_config.items():
      if feature.table is table:
        values = getattr(features[path], "ids", features[path])  # padded
        for local in trainer.run.strategy.experimental_local_results(values):
          ids.append(np.asarray(local).reshape(-1))
    unique = np.unique(np.concatenate(ids))
    layout = row_layout.make(layout_name, table.vocabulary_size, replicas)
    owner = layout.owner(tf.constant(unique, tf.int64)).numpy()
    counts += np.bincount(owner, minlength=replicas)
  return float(counts.max() / counts.mean())


def collective_bytes(graph) -> str:
  """Bytes one replica puts into collectives in one traced train step ("+N
  dynamic": N more collectives whose operands' shapes the trace lost), read
  from `graph` (`_time_steps`' loop: one step in its body, and nothing else
  that takes part in a collective)."""
  total, unknown = collective_byte_count(graph)
  out = planning.human_bytes(total)
  return f"{out} + {unknown} dynamic" if unknown else out


def collective_byte_count(graph, branches: bool = True) -> tuple[int, int]:
  """`collective_bytes` as numbers: (bytes, collectives of unknown size);
  without the branches of conditionals (`tf.cond`) when not `branches`:
  what every step sends, whatever it holds."""
  graphs = [graph]
  total, seen, unknown = 0, set(), 0
  while graphs:
    graph = graphs.pop()
    for op in graph.get_operations():
      # Replica 0's: on the first device (merge-call collectives of every
      # replica are made in one thread, and named alike).
      if op.type.startswith("Collective") and op.device.endswith("CPU:0"):
        value = op.inputs[0]
        if value.shape.num_elements() is None:
          unknown += 1  # MirroredStrategy's all-gather: shape lost
          continue
        total += value.shape.num_elements() * value.dtype.size
      branch_attrs = ("then_branch", "else_branch") if branches else ()
      for attr in ("f", "body", *branch_attrs):
        try:
          name = op.get_attr(attr).name
        except (ValueError, AttributeError):
          continue
        function = graph._functions.get(name)  # pylint: disable=protected-access
        if function is not None and name not in seen:
          seen.add(name)
          graphs.append(function.graph)
  return total, unknown


def compare(strategy):
  """The placements' table; returns the replicated run's Trainer."""
  replicas = strategy.num_replicas_in_sync
  base = _trainer(strategy, None)
  sizes = sorted(base.backend.tables, key=lambda t: -t.vocabulary_size * t.dim)[
    : ARGS.shard_largest
  ]
  sharded_names = [base.backend.table_name(t) for t in sizes]
  batch = next(
    iter(
      base.run.distribute(
        base.run.source, base.settings.global_batch_size, training=True
      )
    )
  )
  runs = {"replicated": base}
  for layout in ARGS.layouts.split(","):
    for exchange in ARGS.exchanges.split(","):
      runs[f"sharded/{layout}/{exchange}"] = _trainer(
        strategy,
        planning.EmbeddingPlacement(
          tables={name: "row_sharded" for name in sharded_names},
          row_layout=layout,
          exchange=exchange,
        ),
      )
  timed = {name: _time_steps(t, batch) for name, t in runs.items()}
  timers = {name: timer for name, (timer, _) in timed.items()}
  times = {name: [] for name in runs}
  cpu_times = {name: [] for name in runs}
  for _ in range(ARGS.reps):  # interleaved
    for name, timer in timers.items():
      wall, cpu = timer()
      times[name].append(wall)
      cpu_times[name].append(cpu)
  gb = base.settings.global_batch_size
  print(
    f"{ARGS.gin_file}: {replicas} CPU replicas, global batch {gb}, row-"
    f"sharded: {', '.join(sharded_names)}; {ARGS.reps} interleaved reps x "
    f"{ARGS.loop} steps; TF threads intra={ARGS.intra} inter={ARGS.inter}, "
    f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
  )
  print(
    "| placement | ms/step | examples/s | x replicated | CPU ms/step "
    "| bytes/replica | planned | exchange/step | collectives/step "
    "| owner balance |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  ref = statistics.median(times["replicated"])
  for name, trainer in runs.items():
    ms = statistics.median(times[name])
    cpu_ms = statistics.median(cpu_times[name])
    plan = _plan(trainer, replicas)
    balance = (
      f"{_owner_balance(batch, trainer, name.split('/')[1], replicas):.2f}"
      if "/" in name
      else "-"
    )
    print(
      f"| {name} | {ms:.1f} | {gb / ms * 1e3:.0f} | {ms / ref:.2f} "
      f"| {cpu_ms:.1f} "
      f"| {planning.human_bytes(_replica_bytes(trainer.backend))} "
      f"| {planning.human_bytes(plan.bytes_per_device)} "
      f"| {planning.human_bytes(plan.exchange_bytes or 0)} "
      f"| {collective_bytes(timed[name][1])} "
      f"| {balance} |"
    )
  return base


def _plan(trainer, replicas):
  backend = trainer.backend
  widths = {
    spec.name: spec.max_ids
    for spec in trainer.run.source.feature_specs
    if spec.multi_hot
  }
  return planning.plan_memory(
    backend.feature_config,
    trainer.run.embedding_optimizer,
    trainer.run.strategy,
    device_memory_bytes=1 << 40,
    backend="tensorcore",
    placement=planning.EmbeddingPlacement(
      tables=backend.placements(),
      exchange={
        name: str(held.exchange)
        for name, held in backend.layouts().items()
        if held.exchange is not None
      }
      or "auto",
    ),
    ids_per_step=planning.ids_per_step(
      backend.feature_config,
      widths,
      trainer.settings.global_batch_size // replicas,
    ),
  )


def budget_run(strategy, base=None) -> None:
  """Tables twice a device's budget: refused replicated, trained sharded.
  `base`: the replicated run's Trainer (`compare`'s), for its tables."""
  replicas = strategy.num_replicas_in_sync
  base = base or _trainer(strategy, None)
  sizes = [
    placement_lib.TableSize(
      base.backend.table_name(t),
      t.vocabulary_size,
      t.dim,
      len(embedding_optimizers.slot_names(base.backend.optimizer_for(t))),
    )
    for t in base.backend.tables
  ]
  total = sum(s.total_bytes for s in sizes)
  memory = int(total / 2 / planning.HEADROOM)  # budget: half the tables
  setting = planning.EmbeddingPlacement(device_memory=memory)
  print(
    f"\nbudget run: tables and slots {planning.human_bytes(total)}, a "
    f"device's memory {planning.human_bytes(memory)} (budget "
    f"{planning.human_bytes(memory * planning.HEADROOM)}, "
    f"{planning.HEADROOM:.0%})"
  )
  try:
    planning.check_fits(
      planning.plan_memory(
        base.backend.feature_config,
        base.run.embedding_optimizer,
        tf.distribute.get_strategy(),
        backend="tensorcore",
        placement=setting,
      )
    )
    print("1 replica, replicated: NOT refused (unexpected)")
  except planning.MemoryPlanError as e:
    print(f"1 replica, replicated: refused: {str(e)[:300]}...")
  steps = ARGS.budget_steps
  trainer = _trainer(
    strategy,
    setting,
    [f"train.train_steps = {steps}", f"train.steps_per_loop = {steps}"]
    + ["train.eval_steps = 2"],
  )
  placed = trainer.backend.placements()
  start = time.perf_counter()
  metrics = trainer.train()
  print(
    f"{replicas} replicas: the planner row-shards "
    f"{sorted(n for n, p in placed.items() if p == 'row_sharded')}, "
    f"{planning.human_bytes(_replica_bytes(trainer.backend))} per replica; "
    f"trained {steps} steps in {time.perf_counter() - start:.1f} s, eval loss "
    f"{metrics['eval/loss']:.4f}"
  )


def main(argv=None) -> None:
  global ARGS
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--gin_file", default="experiments/synthetic_dlrm.gin")
  parser.add_argument(
    "--gin_bindings",
    action="append",
    default=[],
    help="e.g. 'SyntheticCTR.vocab_sizes = (100000, 2000)' (repeatable)",
  )
  parser.add_argument("--replicas", type=int, default=2)
  parser.add_argument("--shard_largest", type=int, default=4)
  parser.add_argument("--layouts", default="contiguous")
  parser.add_argument("--exchanges", default="all_to_all,all_gather")
  parser.add_argument(
    "--per_replica_batch",
    type=int,
    default=0,
    help="examples per replica (global batch = this x replicas); 0: the "
    "gin file's global batch",
  )
  parser.add_argument("--loop", type=int, default=10, help="steps per call")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--budget", action="store_true")
  parser.add_argument(
    "--budget_steps", type=int, default=20, help="steps of the budget run"
  )
  parser.add_argument(
    "--intra_op_threads", type=int, default=0, help="0: as recsys train"
  )
  parser.add_argument(
    "--inter_op_threads", type=int, default=0, help="0: as recsys train"
  )
  ARGS = parser.parse_args(argv)
  ARGS.intra, ARGS.inter, _ = threads.thread_settings(
    ARGS.intra_op_threads, ARGS.inter_op_threads, threads.available_cores()
  )
  tf.config.threading.set_intra_op_parallelism_threads(ARGS.intra)
  tf.config.threading.set_inter_op_parallelism_threads(ARGS.inter)
  if ARGS.per_replica_batch:
    ARGS.gin_bindings.append(
      f"train.global_batch_size = {ARGS.per_replica_batch * ARGS.replicas}"
    )
  strategy, _ = strategy_lib.make_strategy(num_cpu_replicas=ARGS.replicas)
  base = compare(strategy)
  if ARGS.budget:
    budget_run(strategy, base)


ARGS = argparse.Namespace()

if __name__ == "__main__":
  main()
