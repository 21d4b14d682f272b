"""Seconds per epoch of ImplicitALS on a large synthetic matrix, R replicas.

Draws `--pairs` (user, item) pairs — users uniform, items Zipf-skewed like
real catalogues (a few items observed by a large share of the users) — and
trains `recsys.models.retrieval.ials.ImplicitALS` through the tensorcore backend on
`--replicas` logical CPU devices, its tables replicated or row-sharded
(`--placement`), the way a Trainer step does: consecutive batches to
consecutive replicas, each half padded to a multiple of R batches,
histories cut into `--history_chunk` ids, fed as the Trainer feeds them
(`recsys.data.ials_dataset` through `distribute_datasets_from_function`).
Prints the data's shape, the steps, the seconds and CPU-seconds of each
epoch after a first, tracing one, what one replica puts into collectives
in a step (read from the traced step), what the input costs (planned once;
an epoch's batches built alone), and the peak RSS of the process.

  PYTHONPATH=. python benchmarks/ials_scale.py --users 1000000 \\
      --items 100000 --pairs 10000000 --replicas 4 --placement row_sharded
"""

import argparse
import resource
import time

import numpy as np


def _parse() -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 2)[2],
  )
  parser.add_argument("--users", type=int, default=1_000_000)
  parser.add_argument("--items", type=int, default=100_000)
  parser.add_argument("--pairs", type=int, default=10_000_000)
  parser.add_argument("--zipf", type=float, default=1.1, help="item skew")
  parser.add_argument("--dim", type=int, default=16)
  parser.add_argument(
    "--batch_size", type=int, default=4096, help="entries per replica"
  )
  parser.add_argument("--history_chunk", type=int, default=64)
  parser.add_argument("--replicas", type=int, default=4)
  parser.add_argument(
    "--placement", choices=["replicated", "row_sharded"], default="row_sharded"
  )
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--reg", type=float, default=100.0)
  parser.add_argument("--alpha", type=float, default=10.0)
  parser.add_argument("--seed", type=int, default=0)
  from recsys.cli.flags import thread_count  # noqa: PLC0415

  for kind in ("intra", "inter"):
    parser.add_argument(
      f"--{kind}_op_threads",
      type=thread_count,
      default=0,
      help=f"TF {kind}-op threads (0: as `recsys train` picks them here)",
    )
  return parser.parse_args()


def set_threads(args: argparse.Namespace) -> None:
  """TF's threads as `recsys train` sets them on this machine (1 / 2 on 2
  cores), or as `--intra_op_threads` / `--inter_op_threads` say; printed.
  Call before TensorFlow starts its runtime."""
  from recsys._keras import tf  # noqa: PLC0415
  from recsys.process import threads  # noqa: PLC0415

  intra, inter, _ = threads.thread_settings(
    args.intra_op_threads, args.inter_op_threads, threads.available_cores()
  )
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  shown = [str(n) if n else "TF's default" for n in (intra, inter)]
  print(f"TF threads: intra-op {shown[0]}, inter-op {shown[1]}")


def synthetic_pairs(
  users: int, items: int, pairs: int, zipf: float, seed: int
) -> np.ndarray:
  """`[n, 2]` distinct (user, item) pairs, ids from 1 (row 0 unused)."""
  rng = np.random.default_rng(seed)
  weights = 1.0 / np.arange(1, items + 1) ** zipf
  item = rng.choice(items, size=pairs, p=weights / weights.sum()) + 1
  user = rng.integers(1, users + 1, size=pairs)
  return np.unique(np.stack([user, item], 1), axis=0)


def ials_training(
  specs, dim, reg, alpha, strategy=None, placement=None, reg_exponent=0.0
):
  """`(backend, step)`: ImplicitALS's tables on the tensorcore backend
  (SGD(1.0), N(0, 0.01) rows) and a `tf.function` `step(features, labels)`
  that trains one batch per replica as a Trainer step does (lookup under a
  tape, the model's loss, the backend's update)."""
  import backends  # noqa: PLC0415
  from recsys import features as features_lib  # noqa: PLC0415
  from recsys._keras import tf  # noqa: PLC0415
  from recsys.models.retrieval import ials  # noqa: PLC0415

  strategy = strategy or tf.distribute.get_strategy()
  settings = features_lib.EmbeddingSettings(
    dim=dim,
    optimizer=tf.tpu.experimental.embedding.SGD(1.0),
    initializer=tf.random_normal_initializer(0.0, 0.01, seed=0),
  )
  config = features_lib.feature_config(specs, settings)
  ials.check_embedding_optimizer(config)
  from backends.layout import TableLayout  # noqa: PLC0415

  layouts = None if placement is None else TableLayout(placement)
  with strategy.scope():
    backend = backends.create(
      config,
      settings.optimizer,
      strategy,
      backend="tensorcore",
      layouts=layouts,
    )
    backend.build()
    model = ials.ImplicitALS(
      specs, dim=dim, reg=reg, alpha=alpha, reg_exponent=reg_exponent
    )
  return backend, ials_step(strategy, backend, model, list(config))


def ials_step(strategy, backend, model, names, jit_compile=False):
  """A `tf.function` `step(features, labels)` that trains one batch per
  replica of `strategy` as a Trainer step does: the features `names` looked
  up under a tape, the model's loss, the backend's update; with
  `jit_compile`, each replica's step compiled by XLA (a TPU's path; the
  features padded by `backend.preprocess` first)."""
  from recsys._keras import tf  # noqa: PLC0415
  from recsys.models.loss_inputs import LossInputs  # noqa: PLC0415

  def replica_step(ids, features, labels):
    with tf.GradientTape() as tape:
      acts = backend.lookup(ids, training=True)
      tape.watch(acts)
      loss = model.compute_loss(LossInputs(acts, features, labels))
    backend.apply_gradients(tape.gradient(loss, acts))

  compiled = tf.function(replica_step, jit_compile=True)

  def padded_step(features, labels):
    ids, _ = backend.preprocess({n: features["categorical"][n] for n in names})
    # The model reads the dense iALS features; the ragged ids stay outside.
    dense = {k: v for k, v in features.items() if k != "categorical"}
    compiled(ids, dense, labels)

  @tf.function
  def step(features, labels):
    if jit_compile:
      strategy.run(padded_step, args=(features, labels))
    else:
      ids = {n: features["categorical"][n] for n in names}
      strategy.run(replica_step, args=(ids, features, labels))

  return step


def measure(args: argparse.Namespace, strategy) -> dict:
  """Trains `args.epochs` epochs (after a first, tracing one) of the
  `_parse` settings on `strategy`'s replicas, each input pipeline reading
  its replicas' batches; prints what it measures as it goes and returns it:
  seconds, CPU-seconds (this process) and steps per epoch, the collective
  bytes one replica puts into a step on average (`row_sharding.
  collective_byte_count` of the traced step: what every step sends, and
  what the steps adding to the Gramians or a long row's sums send more, in
  the number of such steps of the epoch), the input's cost and this
  process's peak RSS."""
  from recsys.data import ials_batches, ials_dataset, ials_plan  # noqa: PLC0415

  start = time.perf_counter()
  pairs = synthetic_pairs(
    args.users, args.items, args.pairs, args.zipf, args.seed
  )
  users, items = args.users + 1, args.items + 1
  longest = [int(np.bincount(pairs[:, c]).max()) for c in (0, 1)]
  print(
    f"{args.users:,} users x {args.items:,} items, {len(pairs):,} distinct "
    f"pairs (items Zipf {args.zipf}); longest history: user {longest[0]}, "
    f"item {longest[1]} ids; drawn in {time.perf_counter() - start:.1f} s"
  )
  specs = ials_batches.feature_specs(
    pairs, users, items, history_chunk=args.history_chunk
  )
  _, step = ials_training(
    specs, args.dim, args.reg, args.alpha, strategy, args.placement
  )
  replicas = strategy.num_replicas_in_sync
  start = time.perf_counter()
  plan = ials_plan.plan_epoch(
    pairs, users, items, args.batch_size, replicas, args.history_chunk
  )
  planned = time.perf_counter() - start
  # The input of an epoch after the first, as the timed epochs read it
  # (the pipeline repeats): the first pass also builds the pipeline.
  dataset = ials_dataset.epoch_dataset(plan, steps_multiple=replicas)
  passes = []
  for _ in range(2):
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in dataset:
      pass
    passes.append(time.process_time() - cpu_start)
  input_wall = time.perf_counter() - start
  input_cpu = passes[-1]

  def pipeline(ctx):
    return ials_dataset.epoch_dataset(
      plan,
      pipeline=ctx.input_pipeline_id,
      pipelines=ctx.num_input_pipelines,
      steps_multiple=replicas,
    ).repeat()

  batches = iter(strategy.distribute_datasets_from_function(pipeline))
  steps = plan.num_batches // replicas
  seconds, cpu = [], []
  for _ in range(args.epochs + 1):  # the first epoch traces
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
      inputs = next(batches)
      step(*inputs)
    seconds.append(time.perf_counter() - start)
    cpu.append(time.process_time() - cpu_start)
  print(
    f"dim {args.dim}, {replicas} replica(s), tables {args.placement}, "
    f"{args.batch_size} entries per replica and step, history_chunk "
    f"{args.history_chunk}: {steps} steps per epoch"
  )
  print(f"first epoch (tracing): {seconds[0]:.1f} s")
  print("seconds per epoch: " + ", ".join(f"{s:.1f}" for s in seconds[1:]))
  print("CPU-seconds per epoch: " + ", ".join(f"{s:.1f}" for s in cpu[1:]))
  # A script: this folder is on sys.path.
  from row_sharding import collective_byte_count  # noqa: PLC0415

  from recsys import planning  # noqa: PLC0415

  graph = step.get_concrete_function(*inputs).graph
  every, dynamic = collective_byte_count(graph, branches=False)
  conditional = collective_byte_count(graph)[0] - every
  summing = _summing_steps(plan, replicas)
  exchanged = every + conditional * sum(summing.values()) / steps
  print(
    "collectives per replica and step: "
    + planning.human_bytes(every)
    + (f" + {dynamic} dynamic" if dynamic else "")
    + f"; {planning.human_bytes(conditional)} more on each Gramian or long "
    f"row's step (item / user Gramian, long rows: "
    f"{' / '.join(str(n) for n in summing.values())} of the epoch's "
    f"{steps}): {planning.human_bytes(exchanged)} a step on average"
  )
  print(
    f"input: planned once in {planned:.1f} s (NumPy); an epoch's batches "
    f"alone built by tf.data (its second pass) in {input_wall:.2f} s, "
    f"{input_cpu:.2f} CPU-s (the first, building it: {passes[0]:.2f}) "
    f"({input_cpu / max(cpu[-1], 1e-9):.0%} of a training epoch's CPU-s, "
    "which builds them alongside)"
  )
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"peak RSS: {peak:,.0f} MiB")
  return {
    "pairs": len(pairs),
    "steps": steps,
    "seconds": seconds[1:],
    "cpu_seconds": cpu[1:],
    "collective_bytes": exchanged,
    "conditional_collective_bytes": conditional,
    "summing_steps": summing,
    "dynamic_collectives": dynamic,
    "peak_rss_mib": peak,
  }


def _summing_steps(plan, replicas: int) -> dict:
  """The epoch's steps whose batches add to the item Gramian, the user
  Gramian or a long row's sums (`ImplicitALS._add_to_sums`: only they
  all-reduce them), from the kinds of batch its steps hold."""
  from recsys.data import ials_batches as names  # noqa: PLC0415

  kinds = plan.step_kinds(replicas)
  groups = {
    "item_gramian": (names.ITEM_GRAMIAN,),
    "user_gramian": (names.USER_GRAMIAN,),
    "long_rows": (names.USER_LONG, names.ITEM_LONG),
  }
  return {
    name: int(
      np.isin(kinds, [c + r for c in codes for r in (0, names.RESTART)]).sum()
    )
    for name, codes in groups.items()
  }


def main() -> None:
  args = _parse()
  import recsys  # noqa: F401, PLC0415  (Keras 2 before TensorFlow)
  from recsys._keras import tf  # noqa: PLC0415

  set_threads(args)
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
  )
  from recsys import _tf_internal  # noqa: PLC0415

  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = (
    _tf_internal.mirrored_strategy(devices[: args.replicas])
    if args.replicas > 1
    else tf.distribute.get_strategy()
  )
  measure(args, strategy)


if __name__ == "__main__":
  main()
