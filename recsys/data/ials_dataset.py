"""An iALS epoch plan (`recsys.data.ials_plan`) as a `tf.data` pipeline.

The plan's per-entry arrays are sliced a batch at a time, and each batch's
histories are gathered from the plan's ids by TF ops in the pipeline's
threads: an epoch costs no Python loop. Input pipeline p of P takes the
batches of its replicas only (the runs of several workers).

Example:
  >>> plan = ials_plan.plan_epoch(pairs, 944, 1683, batch_size=256)
  >>> for features, labels in epoch_dataset(plan): ...
"""

from collections.abc import Iterator

import numpy as np

from recsys._keras import tf
from recsys.data import ials_batches as names
from recsys.data import ials_plan
from recsys.errors import SettingsError


class PipelinesError(SettingsError):
  """The replicas of a step cannot be split evenly over the input
  pipelines (`ImplicitALSData.steps_multiple` over the pipelines)."""


def pipeline_batches(
  num_batches: int, steps_multiple: int, pipeline: int, pipelines: int
) -> np.ndarray:
  """The epoch's batch indices input pipeline `pipeline` of `pipelines`
  reads: batch k feeds replica k mod `steps_multiple`, and each pipeline
  feeds `steps_multiple / pipelines` consecutive replicas, in order.

  Raises:
    PipelinesError: `steps_multiple` is no multiple of `pipelines`.
  """
  if steps_multiple % pipelines:
    raise PipelinesError(
      f"iALS input: {pipelines} input pipelines cannot each feed a whole "
      f"share of ImplicitALSData.steps_multiple = {steps_multiple} replicas;"
      " set steps_multiple to the number of replicas (a multiple of the "
      "workers)."
    )
  batches = np.arange(num_batches)
  per_pipeline = steps_multiple // pipelines
  return batches[(batches % steps_multiple) // per_pipeline == pipeline]


def epoch_dataset(
  plan: ials_plan.EpochPlan,
  user: str = names.USER,
  item: str = names.ITEM,
  pipeline: int = 0,
  pipelines: int = 1,
  steps_multiple: int = 1,
) -> tf.data.Dataset:
  """The plan's batches `(features, labels)`, those of `pipeline` of
  `pipelines` (`pipeline_batches`), in order; the features of
  `recsys.data.ials_batches`."""
  size = plan.batch_size
  keep = pipeline_batches(plan.num_batches, steps_multiple, pipeline, pipelines)

  def by_batch(entries: np.ndarray) -> np.ndarray:
    return entries.reshape(plan.num_batches, size)[keep]

  entries = plan.entries
  slices = {
    name: by_batch(getattr(entries, name))
    for name in ("side", "row", "counts", "segment", "starts", "lengths")
  }
  slices["of_users"] = entries.of_users[keep]
  ids = tf.constant(plan.ids)

  def history(batch: dict, mine: tf.Tensor) -> tf.RaggedTensor:
    lengths = batch["lengths"] * tf.cast(mine, tf.int64)
    where = tf.ragged.range(batch["starts"], batch["starts"] + lengths)
    return tf.RaggedTensor.from_row_lengths(
      tf.gather(ids, where.flat_values), lengths
    )

  @tf.autograph.experimental.do_not_convert
  def build(batch: dict) -> tuple[dict, tf.Tensor]:
    side, row = batch["side"], batch["row"]
    zeros = tf.zeros_like(row)
    categorical = {
      user: tf.where(_any_of(side, names.SOLVES_USERS), row, zeros),
      item: tf.where(_any_of(side, names.SOLVES_ITEMS), row, zeros),
      names.USER_HISTORY: history(batch, batch["of_users"]),
      names.ITEM_HISTORY: history(batch, tf.logical_not(batch["of_users"])),
    }
    features = {
      "categorical": categorical,
      names.SIDE: side,
      names.COUNTS: batch["counts"],
      names.SEGMENT: batch["segment"],
    }
    return features, tf.zeros([size], tf.float32)

  return tf.data.Dataset.from_tensor_slices(slices).map(
    build, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
  )


def _any_of(side: tf.Tensor, codes: tuple) -> tf.Tensor:
  """Where `side` is one of `codes`."""
  return tf.reduce_any(side[:, tf.newaxis] == tf.constant(codes, side.dtype), 1)


def epoch_batches(
  pairs: np.ndarray,
  num_user_rows: int,
  num_item_rows: int,
  batch_size: int,
  user: str = names.USER,
  item: str = names.ITEM,
  steps_multiple: int = 1,
  history_chunk: int | None = None,
) -> Iterator[tuple[dict, tf.Tensor]]:
  """One epoch's batches in order, eagerly (`ials_plan.plan_epoch`'s
  arguments): for tests, benchmarks and loops of one's own."""
  plan = ials_plan.plan_epoch(
    pairs,
    num_user_rows,
    num_item_rows,
    batch_size,
    steps_multiple,
    history_chunk,
  )
  yield from epoch_dataset(plan, user, item)
