"""What every source shares: the `DataSource` interface, sharding, and `distribute`.

A source builds a per-replica `tf.data.Dataset` of `(features, labels)` for
one input pipeline; `distribute` hands it to
`strategy.distribute_datasets_from_function` with per-replica batch sizes and
the embedding backend's `input_options()`.

Example:
  >>> source = recsys.data.SyntheticCTR()
  >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  >>> dist = recsys.data.distribute(strategy, source, global_batch_size=64)
  >>> features, labels = next(iter(dist))   # PerReplica values of 32 examples
"""

import abc
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from recsys.data.spec import FeatureSpec

AUTOTUNE = tf.data.AUTOTUNE

Batch = Tuple[Dict[str, Any], tf.Tensor]


class DataSource(abc.ABC):
  """A source of `(features, labels)` batches (see recsys.data for the contract).

  Attributes:
    feature_specs: the categorical features in `features["categorical"]`.
    num_dense: width of `features["dense"]` (0: no dense key).
  """

  feature_specs: List[FeatureSpec]
  num_dense: int = 0

  @abc.abstractmethod
  def dataset(self,
              batch_size: int,
              *,
              training: bool = True,
              input_context: Optional[tf.distribute.InputContext] = None,
              drop_remainder: bool = True,
              repeat: Optional[bool] = None) -> tf.data.Dataset:
    """The batches of one input pipeline.

    Args:
      batch_size: the PER-REPLICA batch size B.
      training: the training split (else the evaluation split).
      input_context: shard for `input_pipeline_id` of `num_input_pipelines`.
      drop_remainder: drop a final partial batch, so every batch has static
        shape `[B, ...]` (what replicated and TPU strategies need).
      repeat: repeat the split forever; None means "when training".

    Returns:
      A dataset of `(features, labels)`, labels float32 `[B]`.
    """

  def spec(self, name: str) -> FeatureSpec:
    """The `FeatureSpec` called `name` (raises KeyError listing the names)."""
    for spec in self.feature_specs:
      if spec.name == name:
        return spec
    raise KeyError(f"{type(self).__name__} has no feature {name!r}; it has "
                   f"{[s.name for s in self.feature_specs]}.")


class InvalidBatchSizeError(ValueError):
  """A batch size that is not a positive integer."""


def check_batch_size(batch_size: int) -> int:
  """Returns `batch_size` as an int, or raises InvalidBatchSizeError."""
  if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
    raise InvalidBatchSizeError(
        f"batch_size must be a positive integer (the per-replica batch), got {batch_size!r}.")
  return int(batch_size)


def shard_of(input_context: Optional[tf.distribute.InputContext]) -> Tuple[int, int]:
  """`(input_pipeline_id, num_input_pipelines)`, `(0, 1)` without a context."""
  if input_context is None:
    return 0, 1
  return input_context.input_pipeline_id, input_context.num_input_pipelines


def finish(dataset: tf.data.Dataset, *, deterministic: bool = True) -> tf.data.Dataset:
  """Prefetches and sets the options every source wants.

  Auto-sharding is switched off: sources shard themselves by input context
  (files, batch indices), and `distribute_datasets_from_function` relies on
  it. Ops inside a map call run single-threaded (see below).
  """
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.OFF)
  options.deterministic = deterministic
  # Parallelism comes from parallel map calls; single-threaded ops inside
  # each call cost less CPU than splitting small ops over the intra-op pool.
  options.threading.max_intra_op_parallelism = 1
  return dataset.prefetch(AUTOTUNE).with_options(options)


def distribute(strategy: tf.distribute.Strategy,
               source: DataSource,
               global_batch_size: int,
               training: bool = True,
               input_options: Optional[tf.distribute.InputOptions] = None,
               **dataset_kwargs) -> tf.distribute.DistributedDataset:
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
    **dataset_kwargs: passed on to `source.dataset` (e.g. drop_remainder, repeat).

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
        f"{replicas} replicas; use a multiple of {replicas}.")

  def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    return source.dataset(ctx.get_per_replica_batch_size(global_batch_size),
                          training=training, input_context=ctx, **dataset_kwargs)

  return strategy.distribute_datasets_from_function(dataset_fn, input_options)
