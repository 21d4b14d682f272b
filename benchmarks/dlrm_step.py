"""The default experiment's train step vs. its embedding part and its input.

Builds the Trainer of `experiments/synthetic_dlrm.gin` (the `make demo` run)
and times, on one cached batch in this process:

  step       the whole train step (lookup, DLRM, losses, dense Adam, embedding
             update), `--loop` steps per tf.function call as the trainer runs it
  embedding  only the embedding part: lookup + apply_gradients (the
             activations' gradients replaced by ones)
  dense      only the dense part: the model's loss (on the trainer's batch
             slices), metrics, gradients and the dense optimizer's update,
             on cached activations
  input      the input pipeline alone (batches/s of the trainer's distributed
             dataset, preprocess included)

The issue 6 goal is step <= 1.3x embedding, and input faster than step.
Parts are timed interleaved (the machine may be shared); `cpu ms` is this
process's CPU time per step (2 threads busy -> about 2x wall), steadier than
wall time when other processes load the cores.

    python benchmarks/dlrm_step.py [--gin_file experiments/synthetic_dlrm.gin] [--profile]
"""

import argparse
import functools
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import sys  # noqa: E402

import tensorflow as tf  # noqa: E402

import recsys  # noqa: E402,F401  (Keras 2 before TensorFlow)
import recsys.training.train  # noqa: E402,F401
from recsys import config as config_lib  # noqa: E402
from recsys.models.base import replica_loss  # noqa: E402
from recsys.models.loss_inputs import LossInputs  # noqa: E402
from recsys.process import threads  # noqa: E402
from recsys.serving.lookup import split_batch  # noqa: E402
from recsys.training import batch_slices  # noqa: E402

train_lib = sys.modules["recsys.training.train"]


def _time(fn, reps: int, per_call: int) -> tuple:
  """Median (wall ms, CPU ms) per step over `reps` calls of `fn` (each `per_call` steps)."""
  wall, cpu = [], []
  for _ in range(reps):
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall.append((time.perf_counter() - start) / per_call)
    cpu.append((time.process_time() - start_cpu) / per_call)
  return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--gin_file", default="experiments/synthetic_dlrm.gin")
  parser.add_argument("--loop", type=int, default=20, help="steps per call")
  parser.add_argument("--reps", type=int, default=8)
  parser.add_argument(
    "--intra_threads",
    type=int,
    default=0,
    help="0: as `recsys train` chooses (recsys.process.threads)",
  )
  parser.add_argument("--inter_threads", type=int, default=0)
  parser.add_argument(
    "--profile",
    action="store_true",
    help="also print the op-time table of the whole step",
  )
  args = parser.parse_args(argv)
  args.intra_threads, args.inter_threads, _ = threads.thread_settings(
    args.intra_threads, args.inter_threads, threads.available_cores()
  )
  tf.config.threading.set_intra_op_parallelism_threads(args.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)

  config_lib.parse(
    [args.gin_file], ["train.progress_bar = False", "train.summaries = False"]
  )
  trainer = train_lib.train(model_dir=tempfile.mkdtemp(), action="build")
  steps = trainer.steps
  dataset = trainer.run.distribute(
    trainer.run.source,
    trainer.settings.global_batch_size,
    training=True,
  )
  batch = next(iter(dataset))
  backend, names = trainer.backend, list(trainer.backend.feature_config)
  strategy = trainer.run.strategy

  @tf.function
  def full(n):
    for _ in tf.range(n):
      strategy.run(steps.train_step, args=(batch,))

  def embedding_step(b):
    ids, weights = split_batch(b, names)
    acts = backend.lookup(ids, weights, training=True)
    backend.apply_gradients(tf.nest.map_structure(tf.ones_like, acts))

  @tf.function
  def embedding_only(n):
    for _ in tf.range(n):
      strategy.run(embedding_step, args=(batch,))

  model, optimizer = trainer.model, trainer.run.dense_optimizer
  cached = strategy.run(
    lambda b: backend.lookup(*split_batch(b, names), training=False),
    args=(batch,),
  )

  def dense_step(b, acts):
    features, labels = b
    with tf.GradientTape() as tape:
      tape.watch(acts)
      loss = replica_loss(
        model,
        batch_slices.per_example_loss(
          model, LossInputs(acts, features, labels), steps.batch_slices
        ),
        trainer.settings.global_batch_size,
      )
    grads, act_grads = tape.gradient(loss, (model.trainable_variables, acts))
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return act_grads

  @tf.function
  def dense_only(n):
    for _ in tf.range(n):
      strategy.run(dense_step, args=(batch, cached))

  n = tf.constant(args.loop)
  parts = {"step": full, "embedding": embedding_only, "dense": dense_only}
  for fn in parts.values():
    fn(n)
  rows = {part: [] for part in parts}
  for _ in range(args.reps):  # interleaved
    for part, fn in parts.items():
      rows[part].append(_time(functools.partial(fn, n), 1, args.loop))
  iterator = iter(dataset)
  for _ in range(5):
    next(iterator)
  rows["input"] = [_time(lambda: next(iterator), args.reps * args.loop, 1)]
  gb = trainer.settings.global_batch_size
  print(
    f"{args.gin_file}: global batch {gb}, threads intra={args.intra_threads} "
    f"inter={args.inter_threads}, backend {trainer.run.backend_name}, "
    f"{steps.batch_slices} batch slice(s), "
    f"{args.reps} interleaved reps x {args.loop} steps"
  )
  print("| part      | ms/step | examples/s | x embedding | cpu ms/step |")
  print("|-----------|---------|------------|-------------|-------------|")
  emb_ms = statistics.median(wall for wall, _ in rows["embedding"])
  for part in ("step", "embedding", "dense", "input"):
    ms = statistics.median(wall for wall, _ in rows[part])
    cpu = statistics.median(c for _, c in rows[part])
    print(
      f"| {part:9s} | {ms:7.2f} | {gb / ms * 1e3:10.0f} | {ms / emb_ms:11.2f} "
      f"| {cpu:11.2f} |"
    )
  if args.profile:
    import op_profile  # pylint: disable=g-import-not-at-top  (this folder)

    print("\nwhole step:")
    op_profile.print_op_table(
      op_profile.profile_steps(
        lambda: full(n), steps=2, steps_per_call=args.loop
      )
    )


if __name__ == "__main__":
  main()
