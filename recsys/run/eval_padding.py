"""Whole evaluation batches with a mask, so every eval example is scored once.

Compiled and replicated steps need batches of one static size, but an eval
split rarely divides into them: dropping the last partial batch loses
examples (a split smaller than one batch scores nothing). Instead each batch
of the split is padded to the per-replica size with empty rows and carries a
`[B]` float mask (1 for a real example, 0 for padding), and whole padding
batches are appended so every step gives each of a pipeline's replicas a
batch. Models weight their loss and metrics by the mask.

Example:
  >>> ds = source.dataset(8, training=False, drop_remainder=False, repeat=False)
  >>> ds = pad_eval_batches(ds, batch_size=8, batches_per_step=2)
  >>> features, labels, mask = next(iter(ds))    # mask [8], 1.0 on real rows
"""

from typing import Any

import tensorflow as tf


def num_rows(batch: Any) -> tf.Tensor:
  """The number of examples (rows) of a batch: its first component's."""
  first = tf.nest.flatten(batch, expand_composites=False)[0]
  if isinstance(first, tf.RaggedTensor):
    return tf.cast(first.nrows(), tf.int32)
  if isinstance(first, tf.SparseTensor):
    return tf.cast(first.dense_shape[0], tf.int32)
  return tf.shape(first)[0]


def _pad_rows(t: Any, size: int) -> Any:
  """`t` with empty (zero) rows appended up to `size` rows."""
  if isinstance(t, tf.RaggedTensor):
    splits = t.row_splits
    extra = tf.cast(size, splits.dtype) - t.nrows()
    splits = tf.concat([splits, tf.fill([extra], splits[-1])], 0)
    return tf.RaggedTensor.from_row_splits(t.values, splits, validate=False)
  if isinstance(t, tf.SparseTensor):
    shape = tf.concat([[tf.cast(size, tf.int64)], t.dense_shape[1:]], 0)
    return tf.SparseTensor(t.indices, t.values, shape)
  t = tf.convert_to_tensor(t)
  extra = size - tf.shape(t)[0]
  padded = tf.pad(t, [[0, extra]] + [[0, 0]] * (t.shape.rank - 1))
  return tf.ensure_shape(padded, [size] + t.shape[1:].as_list())


def _no_rows(t: Any) -> Any:
  """`t` cut to zero rows (the seed of an all-padding batch)."""
  if isinstance(t, tf.SparseTensor):
    shape = tf.concat([[tf.constant(0, tf.int64)], t.dense_shape[1:]], 0)
    return tf.SparseTensor(t.indices[:0], t.values[:0], shape)
  return t[:0]


def pad_batch(batch: Any, size: int):
  """`(features, labels, mask)`: a batch of at most `size` rows made whole.

  Args:
    batch: `(features, labels)` in the data contract, n <= size rows.
    size: the per-replica batch size B.

  Returns:
    The batch padded to B rows (zeros, empty bags) and a float32 mask `[B]`
    with 1.0 on the n real rows.
  """
  n = num_rows(batch)
  mask = tf.cast(tf.range(size) < n, tf.float32)
  features, labels = tf.nest.map_structure(
    lambda t: _pad_rows(t, size), tuple(batch)
  )
  return features, labels, mask


def pad_eval_batches(
  dataset: tf.data.Dataset, batch_size: int, batches_per_step: int = 1
) -> tf.data.Dataset:
  """An eval pipeline's batches, each whole and masked, in whole steps.

  Args:
    dataset: one input pipeline's `(features, labels)` batches of at most
      `batch_size` rows, finite (`drop_remainder=False, repeat=False`).
    batch_size: the per-replica batch size B.
    batches_per_step: batches one step takes from this pipeline (its
      replicas); the batch count is padded up to a multiple of it with
      all-padding batches.

  Returns:
    A dataset of `(features, labels, mask)` whose every batch has B rows;
    the masks sum to the number of examples in `dataset`.
  """
  pad = lambda *batch: pad_batch(batch, batch_size)  # noqa: E731
  padded = dataset.map(tf.autograph.experimental.do_not_convert(pad))
  if batches_per_step <= 1:
    return padded
  empty = dataset.take(1).map(
    tf.autograph.experimental.do_not_convert(
      lambda *batch: pad(*tf.nest.map_structure(_no_rows, tuple(batch)))
    )
  )
  # n real batches + (k - 1) padding ones, cut into whole groups of k: the
  # ceil(n / k) groups hold every real batch and at most k - 1 padding ones.
  return (
    padded.concatenate(empty.repeat(batches_per_step - 1))
    .batch(batches_per_step, drop_remainder=True)
    .unbatch()
  )
