"""The one place a data source becomes a distributed dataset.

Every strategy reads a source the same way: input pipeline `k` of `n` gets
`source.dataset(per_replica_batch, input_context=ctx)` and the strategy
distributes the pipelines with the embedding backend's `input_options()`.

  * default, mirrored and multi-worker mirrored strategies (and TPU ones):
    `strategy.distribute_datasets_from_function`, per-replica batches of
    `global_batch_size / num_replicas_in_sync`;
  * parameter servers: training data is a per-worker dataset (worker `k` of
    `W` reads pipeline `k` of `W`; one replica per worker, so its batch is
    the global batch), evaluation data a dataset on the coordinator.

`distribute` is the plain form (for a custom loop); `training_input`
and `eval_input` are the trainer's (whole static batches, preprocessed by
the backend, resumed training skips the steps already run, evaluation reads
every example once in padded, masked batches).

Example:
  >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  >>> dist = distribute(strategy, SyntheticCTR(), global_batch_size=64)
  >>> features, labels = next(iter(dist))   # PerReplica values of 32 examples
"""

import functools
import math
from collections.abc import Callable
from typing import Any

from recsys._keras import tf
from recsys.data.pipeline import (
  DataSource,
  InvalidBatchSizeError,
  check_batch_size,
)
from recsys.run import eval_padding
from recsys.run.strategy import num_workers
from recsys.serving.lookup import split_batch

#: `(features, labels[, mask]) -> (features, labels[, mask])`, on the host.
Preprocess = Callable[..., Any]

#: `(input_context or None, per-replica batch) -> dataset` of one pipeline.
MakeDataset = Callable[[tf.distribute.InputContext | None, int], Any]


def distribute(
  strategy: tf.distribute.Strategy,
  source: DataSource,
  global_batch_size: int,
  training: bool = True,
  input_options: tf.distribute.InputOptions | None = None,
  **dataset_kwargs,
) -> tf.distribute.DistributedDataset:
  """Distributes `source` over `strategy`'s replicas.

  Each input pipeline gets `source.dataset(per_replica_batch, training=...,
  input_context=ctx)`, where `per_replica_batch = global_batch_size /
  num_replicas_in_sync`.

  Args:
    strategy: the distribution strategy.
    source: any `DataSource`.
    global_batch_size: examples per step over all replicas; must divide evenly.
    training: training (else evaluation) split.
    input_options: the embedding backend's `input_options()`.
    **dataset_kwargs: passed on to `source.dataset` (e.g. drop_remainder,
      repeat).

  Returns:
    A distributed dataset of PerReplica `(features, labels)`.

  Raises:
    InvalidBatchSizeError: the global batch does not split over the replicas.
  """
  global_batch_size = check_batch_size(global_batch_size)
  replicas = strategy.num_replicas_in_sync
  if global_batch_size % replicas:
    raise InvalidBatchSizeError(
      f"global_batch_size {global_batch_size} does not split evenly over "
      f"{replicas} replicas; use a multiple of {replicas}."
    )

  def make(ctx, per_replica: int) -> tf.data.Dataset:
    return source.dataset(
      per_replica, training=training, input_context=ctx, **dataset_kwargs
    )

  return _from_function(strategy, global_batch_size, make, input_options)


def training_input(
  strategy: tf.distribute.Strategy,
  source: DataSource,
  global_batch_size: int,
  preprocess: Preprocess,
  *,
  options: tf.distribute.InputOptions | None = None,
  skip_steps: int = 0,
  coordinator: Any = None,
):
  """The training split, endless, for the trainer's step functions.

  Args:
    strategy: the distribution strategy.
    source: the training source.
    global_batch_size: examples per step over all replicas.
    preprocess: the backend's host-side preprocessing of a batch.
    options: the backend's input options.
    skip_steps: steps already trained (a resume): they are skipped.
    coordinator: the `ClusterCoordinator` under parameter servers, else None.

  Returns:
    A distributed dataset (a per-worker one under parameter servers).
  """
  if coordinator is not None:
    return _per_worker(
      coordinator, source, global_batch_size, preprocess, skip_steps, options
    )

  def make(ctx, per_replica: int) -> tf.data.Dataset:
    step = _batches_per_step(ctx)
    return _training_batches(
      source, ctx, per_replica, skip_steps * step, preprocess
    )

  return _from_function(strategy, global_batch_size, make, options)


def eval_input(
  strategy: tf.distribute.Strategy,
  source: DataSource,
  global_batch_size: int,
  preprocess: Preprocess,
  *,
  options: tf.distribute.InputOptions | None = None,
  take_steps: int | None = None,
  coordinator: Any = None,
):
  """The evaluation split, every example once, in whole masked batches.

  Args: those of `training_input`, with `take_steps` (None: the whole split)
    instead of `skip_steps`. Under parameter servers the dataset is read on
    the coordinator (a plain `tf.data.Dataset`).
  """
  if coordinator is not None:
    return _eval_batches(
      source, None, global_batch_size, 1, take_steps, preprocess
    )

  def make(ctx, per_replica: int) -> tf.data.Dataset:
    step = _batches_per_step(ctx)
    take = None if take_steps is None else take_steps * step
    return _eval_batches(source, ctx, per_replica, step, take, preprocess)

  return _from_function(strategy, global_batch_size, make, options)


# -- the pieces --------------------------------------------------------------


def _from_function(
  strategy: tf.distribute.Strategy,
  global_batch_size: int,
  make: MakeDataset,
  options: tf.distribute.InputOptions | None,
) -> tf.distribute.DistributedDataset:
  """`strategy.distribute_datasets_from_function` of `make`'s pipelines."""

  def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    return make(ctx, ctx.get_per_replica_batch_size(global_batch_size))

  return strategy.distribute_datasets_from_function(dataset_fn, options)


def _batches_per_step(ctx: tf.distribute.InputContext) -> int:
  """Batches one step takes from one input pipeline (one per replica)."""
  return max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)


def _training_batches(
  source: DataSource,
  ctx: tf.distribute.InputContext | None,
  batch_size: int,
  skip_batches: int,
  preprocess: Preprocess,
) -> tf.data.Dataset:
  """One pipeline's training batches: whole, endless, preprocessed."""
  ds = source.dataset(
    batch_size, training=True, input_context=ctx, drop_remainder=True
  )
  if skip_batches:
    ds = ds.skip(skip_batches)
  # Infinite to tf.distribute: with a finite (even astronomically long)
  # dataset, MultiWorkerMirroredStrategy hands out batches of unknown size
  # (its "last partial batch" handling), and the compiled steps lose their
  # static shapes.
  return _finish(ds.repeat(), batch_size, preprocess)


def _eval_batches(
  source: DataSource,
  ctx: tf.distribute.InputContext | None,
  batch_size: int,
  batches_per_step: int,
  take_batches: int | None,
  preprocess: Preprocess,
) -> tf.data.Dataset:
  """One pipeline's evaluation batches: every example once, padded, masked,
  their labels checked finite."""
  ds = eval_padding.pad_eval_batches(
    _finite_labels(
      source.dataset(
        batch_size,
        training=False,
        input_context=ctx,
        drop_remainder=False,
        repeat=False,
      ),
      type(source).__name__,
      ctx,
    ),
    batch_size,
    batches_per_step,
  )
  if take_batches is not None:
    ds = ds.take(take_batches)
  return _finish(ds, batch_size, preprocess)


def _finite_labels(
  ds: tf.data.Dataset,
  source: str,
  ctx: tf.distribute.InputContext | None,
) -> tf.data.Dataset:
  """`ds`'s `(features, labels)` batches, asserting every label is finite.

  A NaN label made `eval/loss` and the metrics NaN (`eval/rmse = NaN` in
  metrics.json) without a word; a training label's NaN stops the run at
  its step (the non-finite loss check). The error names the source, the
  split and the example's position: counted from 0 in the order this input
  pipeline reads the split (with one pipeline, the split's own order).

  Raises (when read):
    InvalidArgumentError: a label is NaN or infinite.
  """
  where = f"the evaluation split of {source}"
  if ctx is not None and ctx.num_input_pipelines > 1:
    where += (
      f" (input pipeline {ctx.input_pipeline_id} of "
      f"{ctx.num_input_pipelines}: its examples counted in the order it "
      "reads them)"
    )

  def check(seen, batch):
    features, labels = batch
    if not labels.dtype.is_floating:
      return seen, (features, labels)
    flat = tf.reshape(labels, [-1])
    finite = tf.math.is_finite(flat)
    ok = tf.reduce_all(finite)

    def message():
      row = tf.argmin(tf.cast(finite, tf.int32), output_type=tf.int64)
      per_row = tf.size(flat, tf.int64) // tf.maximum(
        tf.shape(labels, out_type=tf.int64)[0], 1
      )
      return tf.strings.join(
        [
          f"{where}: example ",
          tf.strings.as_string(seen + row // tf.maximum(per_row, 1)),
          " (counted from 0) has label ",
          tf.strings.as_string(flat[row]),
          "; evaluation labels must be finite numbers (a NaN label makes "
          "eval/loss and the metrics NaN). Fix or remove the example.",
        ]
      )

    text = tf.cond(ok, lambda: tf.constant(""), message)
    with tf.control_dependencies([tf.debugging.Assert(ok, [text])]):
      labels = tf.identity(labels)
    rows = tf.shape(labels, out_type=tf.int64)[0]
    return seen + rows, (features, labels)

  return ds.scan(
    tf.constant(0, tf.int64), tf.autograph.experimental.do_not_convert(check)
  )


def _finish(
  ds: tf.data.Dataset, batch_size: int, preprocess: Preprocess
) -> tf.data.Dataset:
  """Preprocesses, declares the (whole) batch size, prefetches."""
  ds = ds.map(
    tf.autograph.experimental.do_not_convert(preprocess),
    num_parallel_calls=tf.data.AUTOTUNE,
  )
  # Every batch is whole (eval batches padded): say so, for static shapes.
  ds = ds.map(functools.partial(_with_batch_size, batch_size))
  return ds.prefetch(tf.data.AUTOTUNE)


@tf.autograph.experimental.do_not_convert
def _with_batch_size(batch_size: int, *batch):
  """`batch` with its dense tensors' first dimension set to `batch_size`.

  Sources that gather ragged rows can lose the static batch size, and with
  it the padded bags' (`preprocess`): compiled steps need it.
  """

  def fix(t):
    if isinstance(t, tf.Tensor) and t.shape.rank and t.shape[0] is None:
      return tf.ensure_shape(t, [batch_size] + t.shape[1:].as_list())
    return t

  return tf.nest.map_structure(fix, batch)


def _per_worker(
  coordinator,
  source: DataSource,
  global_batch: int,
  preprocess: Preprocess,
  skip_steps: int,
  options: tf.distribute.InputOptions | None,
):
  """A dataset on every worker, each reading its own shard of `source`.

  Worker `k` of `W` reads input pipeline `k` of `W` of the training split
  (one replica per worker, so a worker's batch is the global batch) and
  skips its share of the steps already trained. The dataset function is
  traced once and runs on every worker; it builds the `W` pipelines and
  reads only the one of the worker it runs on
  (`tf.distribute.coordinator.experimental_get_current_worker_index`).
  `iter()` it and pass the iterator to
  `CoordinatedStepFunctions.run_train_steps`.
  """
  strategy = coordinator.strategy
  workers = num_workers(strategy)
  skip = int(math.ceil(skip_steps / workers)) if skip_steps else 0

  def pipeline(k: int) -> tf.data.Dataset:
    ctx = tf.distribute.InputContext(
      num_input_pipelines=workers, input_pipeline_id=k, num_replicas_in_sync=1
    )
    return _training_batches(source, ctx, global_batch, skip, preprocess)

  def dataset_fn(_: tf.distribute.InputContext) -> tf.data.Dataset:
    if workers == 1:
      return pipeline(0)
    index = tf.distribute.coordinator.experimental_get_current_worker_index()
    choice = tf.data.Dataset.from_tensors(tf.cast(index, tf.int64)).repeat()
    ds = tf.data.Dataset.choose_from_datasets(
      [pipeline(k) for k in range(workers)], choice
    )
    return ds.prefetch(tf.data.AUTOTUNE)

  @tf.function
  def per_worker_fn():
    return strategy.distribute_datasets_from_function(dataset_fn, options)

  return coordinator.create_per_worker_dataset(per_worker_fn)


def preprocess(backend: Any, names: list[str], features, labels, *mask):
  """A batch with the tables' `names` ids and weights as `backend` takes them.

  The backend's `preprocess` (e.g. dense bags made sparse) on the batch's
  table inputs; other weights (not of a table) are kept.
  """
  ids, weights = split_batch((features, labels), names)
  ids, weights = backend.preprocess(ids, weights)
  features = dict(features)
  categorical = dict(features["categorical"])
  categorical.update(ids)
  features["categorical"] = categorical
  kept = {k: v for k, v in (weights or {}).items() if v is not None}
  extra = {
    k: v for k, v in (features.get("weights") or {}).items() if k not in names
  }
  if kept or extra:
    features["weights"] = {**extra, **kept}
  else:
    features.pop("weights", None)
  return (features, labels, *mask)
