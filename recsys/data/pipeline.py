"""What every source shares: the `DataSource` interface, sharding, batching.

A source builds a per-replica `tf.data.Dataset` of `(features, labels)` for
one input pipeline; `recsys.run.input.distribute` (the one place a
source is distributed) hands it to
`strategy.distribute_datasets_from_function` with per-replica batch sizes and
the embedding backend's `input_options()`.

`DataSource.dataset` checks and resolves its arguments once (a
`BatchRequest`), asks the source's `_batches(request)` for the batches and
finishes them (prefetch, options). Sources whose example i of a split is a
pure function of i build those batches with `indexed_batches`; retrieval
sources serve their corpus with `candidate_batches`.

Example:
  >>> source = recsys.data.SyntheticCTR()
  >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  >>> from recsys.run import input as input_lib
  >>> dist = input_lib.distribute(strategy, source, global_batch_size=64)
  >>> features, labels = next(iter(dist))   # PerReplica values of 32 examples
"""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from recsys.data.errors import EmptyEvalSetError
from recsys.data.raw import RawParser
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

AUTOTUNE = tf.data.AUTOTUNE

Batch = tuple[dict[str, Any], tf.Tensor]

_ENDLESS_BATCHES = 1 << 62  # an endless split's batch numbers never reach it


@dataclasses.dataclass(frozen=True)
class BatchRequest:
  """The arguments of `DataSource.dataset`, checked and with defaults resolved.

  Attributes:
    batch_size: the PER-REPLICA batch size B, a positive int.
    training: the training split (else the evaluation split).
    pipeline, pipelines: this input pipeline's id and the number of input
      pipelines (`0, 1` without an input context).
    drop_remainder: drop a final partial batch (static shape `[B, ...]`).
    repeat: repeat the split forever (`dataset(repeat=None)` means `training`).
  """

  batch_size: int
  training: bool
  pipeline: int
  pipelines: int
  drop_remainder: bool
  repeat: bool


class DataSource(abc.ABC):
  """A source of `(features, labels)` batches (the contract: recsys.data).

  A source implements `_batches(request)`, the batches of one input pipeline;
  `dataset()` checks the arguments and finishes the batches. (A source may
  override `dataset()` itself instead.)

  Attributes:
    feature_specs: the categorical features in `features["categorical"]`.
    num_dense: width of `features["dense"]` (0: no dense key).
  """

  feature_specs: list[FeatureSpec]
  num_dense: int = 0

  def dataset(
    self,
    batch_size: int,
    *,
    training: bool = True,
    input_context: tf.distribute.InputContext | None = None,
    drop_remainder: bool = True,
    repeat: bool | None = None,
  ) -> tf.data.Dataset:
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

    Raises:
      InvalidBatchSizeError: `batch_size` is not a positive integer. (Each
        source's `_batches` lists what else it raises: a split too small for
        a batch, missing evaluation files.)
    """
    pipeline, pipelines = shard_of(input_context)
    request = BatchRequest(
      batch_size=check_batch_size(batch_size),
      training=bool(training),
      pipeline=pipeline,
      pipelines=pipelines,
      drop_remainder=bool(drop_remainder),
      repeat=bool(training if repeat is None else repeat),
    )
    return finish(self._batches(request))

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    """The batches `request` asks for, before `finish` (a source's part)."""
    raise NotImplementedError(
      f"{type(self).__name__} implements neither _batches(request) nor "
      "dataset(...); a DataSource needs one of them."
    )

  def known_optimum(self, ks: tuple[int, ...] = ()) -> dict[str, float]:
    """The best metrics any model can reach on this data, where known.

    Synthetic sources know them (the Bayes-optimal AUC, top-k hit rates);
    the trainer reports them next to the trained model's metrics.

    Args:
      ks: the retrieval model's top-k cut-offs (empty for ranking).

    Returns:
      Metric name -> value; empty (the default) when unknown.
    """
    del ks
    return {}

  def raw_parser(self) -> RawParser | None:
    """The TF transformation of this source's raw values into `features`.

    File-backed sources return the parser their reader itself uses, so an
    export can serve raw features exactly as training saw them; None (the
    default, and synthetic sources) means the source has no raw form.
    """
    return None

  def input_files(self) -> list[str]:
    """The files this source reads (both splits, vocabularies, metadata).

    A run records their fingerprints (`recsys.model_dir.run_inputs`), so
    that resuming, evaluating or exporting it over changed files is refused.
    Empty (the default): the source reads no file (synthetic data).
    """
    return []

  def check_eval_split(self) -> None:
    """Opens the evaluation split and reads its first example.

    The trainer calls it before the first training step, so that a missing
    or empty evaluation split fails before hours of training rather than
    after them. Sources raise their own errors from `_batches` (missing
    files, a split setting that leaves no example); this adds the generic
    check that at least one example comes out.

    Raises:
      EmptyEvalSetError: the evaluation split has no example.
    """
    dataset = self.dataset(
      1, training=False, repeat=False, drop_remainder=False
    )
    for _ in dataset.take(1):
      return
    raise EmptyEvalSetError(empty_eval_message(self))

  def spec(self, name: str) -> FeatureSpec:
    """The `FeatureSpec` called `name` (raises KeyError listing the names)."""
    for spec in self.feature_specs:
      if spec.name == name:
        return spec
    raise KeyError(
      f"{type(self).__name__} has no feature {name!r}; it has "
      f"{[s.name for s in self.feature_specs]}."
    )


def empty_eval_message(source: Any) -> str:
  """What to do about an evaluation split without an example."""
  name = type(source).__name__
  return (
    f"the evaluation split of {name} has no example, so there is nothing "
    "to score; give the source evaluation data (e.g. num_eval_examples > 0 "
    "for synthetic sources, a test_fraction > 0 for MovieLens, eval files "
    "that are not empty) or set train.eval_data to a source that has some."
  )


class InvalidBatchSizeError(SettingsError):
  """A batch size that is not a positive integer."""


def check_batch_size(batch_size: int) -> int:
  """Returns `batch_size` as an int, or raises InvalidBatchSizeError."""
  if (
    isinstance(batch_size, bool)
    or int(batch_size) != batch_size
    or batch_size < 1
  ):
    raise InvalidBatchSizeError(
      "batch_size must be a positive integer (the per-replica batch), got "
      f"{batch_size!r}."
    )
  return int(batch_size)


def shard_of(
  input_context: tf.distribute.InputContext | None,
) -> tuple[int, int]:
  """`(input_pipeline_id, num_input_pipelines)`, `(0, 1)` without a context."""
  if input_context is None:
    return 0, 1
  return input_context.input_pipeline_id, input_context.num_input_pipelines


def finish(
  dataset: tf.data.Dataset, *, deterministic: bool = True
) -> tf.data.Dataset:
  """Prefetches and sets the options every source wants.

  Auto-sharding is switched off: sources shard themselves by input context
  (files, batch indices), and `distribute_datasets_from_function` relies on
  it. Ops inside a map call run single-threaded (see below).
  """
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
    tf.data.experimental.AutoShardPolicy.OFF
  )
  options.deterministic = deterministic
  # Parallelism comes from parallel map calls; single-threaded ops inside
  # each call cost less CPU than splitting small ops over the intra-op pool.
  options.threading.max_intra_op_parallelism = 1
  return dataset.prefetch(AUTOTUNE).with_options(options)


def indexed_batches(
  request: BatchRequest,
  total: int | None,
  make_batch: Callable[[tf.Tensor], Batch],
  error: type[ValueError] = ValueError,
) -> tf.data.Dataset:
  """The batches of a split whose example i is a pure function of i.

  Batch b holds examples [b*B, (b+1)*B); input pipeline p of P generates
  batches p, p+P, p+2P, ... A split of `total=None` examples is infinite (and
  not repeated); with `drop_remainder=False` a finite split ends with its
  partial batch.

  Args:
    request: what `DataSource.dataset` was asked for.
    total: examples in the split; None: infinite.
    make_batch: `(features, labels)` of the examples `index` (int64 `[n]`).
    error: the source's config error, raised when a repeated split gives this
      input pipeline no batch.

  Returns:
    The unfinished dataset of `make_batch` results.

  Raises:
    error: the split is repeated but gives this input pipeline no batch.
  """
  size, pipeline, pipelines = (
    request.batch_size,
    request.pipeline,
    request.pipelines,
  )
  if total is None:  # endless, and its infinite cardinality says so (a
    # range, which measured faster per batch than Dataset.counter's scan)
    ds = tf.data.Dataset.range(pipeline, _ENDLESS_BATCHES, pipelines).apply(
      tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
    )
  else:
    num_batches = total // size if request.drop_remainder else -(-total // size)
    if request.repeat and num_batches <= pipeline:
      raise error(
        f"{total} examples make no full batch of {size} for input pipeline "
        f"{pipeline} of {pipelines}: set num_examples larger, or use a "
        "smaller batch."
      )
    ds = tf.data.Dataset.range(pipeline, num_batches, pipelines)
    if request.repeat:
      ds = ds.repeat()
  # Only a finite split kept whole and not a multiple of B has a partial batch.
  partial_last = (
    total is not None and not request.drop_remainder and total % size
  )

  def make(b):
    index = b * size + tf.range(size, dtype=tf.int64)
    if partial_last:
      index = index[: tf.minimum(tf.cast(size, tf.int64), total - b * size)]
    return make_batch(index)

  return ds.map(
    tf.autograph.experimental.do_not_convert(make),
    num_parallel_calls=AUTOTUNE,
    deterministic=True,
  )


class IndexedSource(DataSource):
  """A source whose example i of a split is a pure function of (seed, i).

  Its batches are `indexed_batches` of `_batch(index, stream)`: batch b
  holds examples [b*B, (b+1)*B) and input pipeline p of P generates batches
  p, p+P, p+2P, ... The training split is infinite unless `num_examples` is
  set; the evaluation split has `num_eval_examples`.

  Subclasses implement `_batch` and set `config_error`, the error raised
  when a repeated split gives an input pipeline no batch.
  """

  num_examples: int | None = None
  num_eval_examples: int = 0
  config_error: type[ValueError] = ValueError

  def _batch(self, index: tf.Tensor, stream: str) -> Batch:
    """`(features, labels)` of examples `index` (int64 `[n]`) of `stream`."""
    raise NotImplementedError

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    stream = "train" if request.training else "eval"
    total = self.num_examples if request.training else self.num_eval_examples
    return indexed_batches(
      request,
      total,
      lambda index: self._batch(index, stream),
      self.config_error,
    )


def candidate_batches(
  ids: range,
  item_features: Callable[[tf.Tensor], dict[str, Any]],
  batch_size: int,
) -> tf.data.Dataset:
  """Every candidate once, in finished `{"categorical": ...}` batches.

  Args:
    ids: the candidate ids, e.g. `range(num_items)`.
    item_features: the candidate features of int64 ids `[n]`.
    batch_size: candidates per batch (the last batch may be smaller).

  Raises:
    InvalidBatchSizeError: `batch_size` is not a positive integer.
  """
  size = check_batch_size(batch_size)
  ds = tf.data.Dataset.range(ids.start, ids.stop, ids.step).batch(size)
  ds = ds.map(
    tf.autograph.experimental.do_not_convert(
      lambda item: {"categorical": item_features(item)}
    ),
    num_parallel_calls=AUTOTUNE,
  )
  return finish(ds)
