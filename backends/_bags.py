"""The bag lookup and row-gradient engine of the backends that own their tables.

A table's features are looked up as one flat bag (`TableBag`): every id of
every feature, the activation row (segment) it adds to, and its factor
`scale` (its weight over its bag's normaliser: 1 for `sum`, the bag's weight
sum for `mean`, the root of its squared-weight sum for `sqrtn`; the raw weight
for sequence features). One lookup de-duplicates the ids, gathers each unique
row once and sums `scale * row` into the segments; its transpose,
`row_gradients`, sums `scale * d(loss)/d(activation)` into each unique row.

Both run either as TF ops or, on CPU hosts outside XLA, as the fused C++
kernels of `backends.tensorcore.kernels` (same math). The dynamic engine
(`backends.tensorcore.engines.dynamic`) composes these functions for every
storage (the rows of a table held elsewhere, on other replicas or parameter
servers, come through `gather_rows`); the static engine (`backends.static_bags`)
shares `combiner_scale`.

Example:
  >>> flat = concat_bags([bags_a, bags_b], "mean")
  >>> out = lookup(flat, table_variable)
  >>> grads = row_gradients(
  ...     tf.concat([d_acts_a, d_acts_b], 0), out.index, flat.segments,
  ...     flat.scale, tf.size(out.unique_ids))
"""

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from backends import _tf_internal
from backends import inputs as inputs_lib

COMBINERS = ("sum", "mean", "sqrtn")


@dataclasses.dataclass
class TableBag:
  """The ids of every feature of one table as one flat bag."""

  ids: tf.Tensor  # int64 [N]
  segments: tf.Tensor  # int32 [N], offset per feature
  scale: tf.Tensor | None  # float32 [N], None when every id counts once
  num_segments: tf.Tensor  # int32 scalar, sum of the features' S_f
  sizes: list[tf.Tensor]  # per feature: S_f
  sorted_segments: bool  # segments non-decreasing


class TableLookup(NamedTuple):
  """What `lookup` returns for one table."""

  acts: tf.Tensor  # float32 [sum_f S_f, D], the features' activations stacked
  unique_ids: tf.Tensor  # int64 [U]
  index: tf.Tensor  # int32 [N]: each id's position in `unique_ids`
  rows: tf.Tensor | None  # float32 [U, D] (TF ops) or None (fused kernel)


def combiner_scale(
  weights: tf.Tensor,
  combiner: str,
  sequence: bool,
  segment_sum: Callable[[tf.Tensor], tf.Tensor],
  per_id: Callable[[tf.Tensor], tf.Tensor],
) -> tf.Tensor:
  """d(activation)/d(row) of each id: its weight over its bag's normaliser.

  Args:
    weights: `[N]`, each id's weight (0 for padding).
    combiner: "sum", "mean" or "sqrtn".
    sequence: a sequence feature (one id per activation: no combining).
    segment_sum: sums a per-id `[N]` tensor into its bags, `[S]`.
    per_id: gives each id its bag's value of a per-bag `[S]` tensor.

  Returns:
    `[N]`; 0 for the ids of a bag whose normaliser is 0.

  Raises:
    ValueError: an unknown combiner.
  """
  if sequence or combiner == "sum":
    return weights
  if combiner == "mean":
    norm = segment_sum(weights)
  elif combiner == "sqrtn":
    norm = tf.sqrt(segment_sum(weights * weights))
  else:
    raise ValueError(
      f"unknown combiner {combiner!r}; use one of {', '.join(COMBINERS)}."
    )
  return tf.math.divide_no_nan(weights, per_id(norm))


def bag_scale(bag: inputs_lib.FlatBags, combiner: str) -> tf.Tensor:
  """`combiner_scale` of the ids of flat bags."""
  return combiner_scale(
    bag.weights,
    combiner,
    bool(bag.sequence_length),
    lambda v: tf.math.unsorted_segment_sum(v, bag.segments, bag.num_segments),
    lambda v: tf.gather(v, bag.segments),
  )


def _unit_scale(bag: inputs_lib.FlatBags, combiner: str) -> bool:
  """Whether every id of `bag` enters its activation with factor 1."""
  return bag.unit_weights and (
    bool(bag.sequence_length) or combiner == "sum" or bag.single_ids
  )


def concat_bags(bags: list[inputs_lib.FlatBags], combiner: str) -> TableBag:
  """Stacks the features of one table: segments offset by earlier features."""
  sizes = [b.num_segments for b in bags]
  scales = [
    None if _unit_scale(b, combiner) else bag_scale(b, combiner) for b in bags
  ]
  if all(s is None for s in scales):
    scale = None
  else:
    scale = tf.concat(
      [
        s if s is not None else tf.ones_like(b.weights)
        for s, b in zip(scales, bags)
      ],
      0,
    )
  if len(bags) == 1:
    return TableBag(
      bags[0].ids,
      bags[0].segments,
      scale,
      sizes[0],
      sizes,
      bags[0].sorted_segments,
    )
  segments, offset = [], tf.constant(0, tf.int32)
  for bag, size in zip(bags, sizes):
    segments.append(bag.segments + offset)
    offset += size
  return TableBag(
    tf.concat([b.ids for b in bags], 0),
    tf.concat(segments, 0),
    scale,
    offset,
    sizes,
    all(b.sorted_segments for b in bags),
  )


def scale_or_empty(scale: tf.Tensor | None) -> tf.Tensor:
  """The fused kernels' spelling of "every id counts once": an empty scale."""
  return scale if scale is not None else tf.zeros([0], tf.float32)


def segment_combine(
  rows: tf.Tensor, index: tf.Tensor, flat: TableBag
) -> tf.Tensor:
  """The table's activations `[sum_f S_f, D]` from its unique rows `[U, D]`.

  Id `i` adds `scale[i] * rows[index[i]]` to activation row `segments[i]`.
  """
  if flat.scale is None and flat.sorted_segments:
    # One fused gather + sorted segment sum, no [N, D] intermediate.
    return tf.raw_ops.SparseSegmentSumWithNumSegments(
      data=rows,
      indices=index,
      segment_ids=flat.segments,
      num_segments=flat.num_segments,
    )
  per_id = tf.gather(rows, index)
  if flat.scale is not None:
    per_id *= flat.scale[:, tf.newaxis]
  return tf.math.unsorted_segment_sum(per_id, flat.segments, flat.num_segments)


def lookup(
  flat: TableBag,
  params: tf.Variable | None,
  gather_rows: Callable[[Any, tf.Tensor], tf.Tensor] = tf.gather,
  fused_ops: Any | None = None,
  concurrent_calls: int = 0,
  quantize: Callable[[tf.Tensor], tf.Tensor] | None = None,
  num_rows: int | None = None,
) -> TableLookup:
  """De-duplicates the table's ids, gathers each row once, combines the bags.

  Args:
    flat: the table's features as one bag (`concat_bags`).
    params: the table variable, if this replica holds it whole (else None);
      float32, or a narrow table's bfloat16 / float16
      (`backends.storage.narrow`).
    gather_rows: `gather_rows(params, unique_ids)` -> `[U, D]` rows (a
      table's storage: shards gathered where they live, or exchanged
      between replicas); a tape on `params` sees what this op records
      (`tf.gather`: `IndexedSlices` of U rows).
    fused_ops: the fused kernels' module: one C++ pass over the ids reading
      `params` in place (a plain CPU variable, outside XLA); without
      `params`, the de-duplication alone (given `num_rows`).
    concurrent_calls: how many such lookups the step runs side by side (its
      tables x replicas; 0: unknown). Fewer than the inter-op threads: the
      sums and the de-duplication are two ops the executor runs side by
      side; else one op, which by default splits over the intra-op threads
      the others leave idle (RECSYS_KERNEL_PARALLEL_MIN_WORK=off keeps every
      call on one thread).
    quantize: the table's simulated quantization of its rows before they
      are combined (`backends.quantization`; the fused kernels combine the
      rows as stored, so a quantized table takes the TF ops). The rows
      returned for the update stay as stored.
    num_rows: the table's rows (its ids' bound), for the fused
      de-duplication of rows read through `gather_rows`.
  """
  # The kernels read float32, bfloat16 and float16 rows (upcast, exact).
  if fused_ops is not None and params is not None and quantize is None:
    # A tape on the table still gets IndexedSlices of the U rows.
    if params.trainable:
      _tf_internal.mark_variable_read(params)
    ids = tf.cast(flat.ids, tf.int64)
    if _separate_dedup(concurrent_calls):
      acts = fused_ops.recsys_bag_sums(
        table=params.handle,
        ids=ids,
        segments=flat.segments,
        scale=scale_or_empty(flat.scale),
        num_segments=flat.num_segments,
      )
      unique_ids, index = fused_ops.recsys_bag_dedup(
        ids=ids, num_rows=int(params.shape[0])
      )
    else:
      acts, unique_ids, index = fused_ops.recsys_bag_lookup(
        table=params.handle,
        ids=ids,
        segments=flat.segments,
        scale=scale_or_empty(flat.scale),
        num_segments=flat.num_segments,
        concurrent_calls=concurrent_calls,
      )
    acts.set_shape([None, params.shape[-1]])  # the kernel cannot see it
    return TableLookup(acts, unique_ids, index, None)
  if fused_ops is not None and num_rows is not None:
    # Rows read elsewhere (another replica's shard): one C++ pass still
    # de-duplicates (the ids in first-appearance order, as `tf.unique`).
    unique_ids, index = fused_ops.recsys_bag_dedup(
      ids=tf.cast(flat.ids, tf.int64), num_rows=num_rows
    )
  else:
    unique_ids, index = tf.unique(flat.ids, out_idx=tf.int32)
  rows = gather_rows(params, unique_ids)
  combined = rows if quantize is None else quantize(rows)
  return TableLookup(
    segment_combine(combined, index, flat), unique_ids, index, rows
  )


def _separate_dedup(concurrent_calls: int) -> bool:
  """Whether the fused lookup runs its bag sums and de-duplication as two ops.

  When the step runs fewer table lookups than TF has inter-op threads, the
  executor runs the de-duplication (needed only by the update) on an idle
  thread beside the sums and the dense model; with more, every thread is
  busy already and one op reads the ids once.
  """
  threads = tf.config.threading.get_inter_op_parallelism_threads()
  return 0 < concurrent_calls < (threads or os.cpu_count() or 1)


def split_features(acts: tf.Tensor, flat: TableBag) -> list[tf.Tensor]:
  """`lookup`'s stacked activations, one `[S_f, D]` tensor per feature."""
  return tf.split(acts, flat.sizes) if len(flat.sizes) > 1 else [acts]


def feature_gradients(
  flat_grads: Sequence[Any],
  positions: Sequence[int],
  num_segments: Sequence[Any],
  dim: int,
) -> list[tf.Tensor]:
  """d(loss)/d(activations) of a table's features, each `[S_f, D]`.

  Args:
    flat_grads: every feature's activation gradient (None: the loss does not
      use it; `IndexedSlices` allowed), in config order.
    positions: the table's features' indices in `flat_grads`.
    num_segments: their number of activation rows `S_f`, for the None ones.
    dim: the table's dimension.
  """
  out = []
  for pos, size in zip(positions, num_segments):
    grad = flat_grads[pos]
    if grad is None:
      grad = tf.zeros([size, dim], tf.float32)
    elif isinstance(grad, tf.IndexedSlices):
      grad = tf.convert_to_tensor(grad)
    out.append(tf.reshape(tf.cast(grad, tf.float32), [-1, dim]))
  return out


def row_gradients(
  grads: tf.Tensor,
  index: tf.Tensor,
  segments: tf.Tensor,
  scale: tf.Tensor | None,
  num_rows: tf.Tensor,
  fused_ops: Any | None = None,
) -> tf.Tensor:
  """d(loss)/d(row) for each unique row, `[U, D]`: `lookup`'s transpose.

  Row `index[i]` gets `scale[i] * grads[segments[i]]` for every id `i`.

  Args:
    grads: `[sum_f S_f, D]`, the features' activation gradients stacked.
    index: int32 `[N]`, each id's unique row.
    segments: int32 `[N]`, each id's activation row.
    scale: float32 `[N]`, or None when every id counts once.
    num_rows: `U`.
    fused_ops: the fused kernels' module (one C++ pass), or None.
  """
  if fused_ops is not None:
    return fused_ops.recsys_row_gradients(
      grads=grads,
      index=index,
      segments=segments,
      scale=scale_or_empty(scale),
      num_rows=num_rows,
    )
  if scale is None:
    # Fused gather + scatter-add: row index[i] += grads[segments[i]].
    return tf.raw_ops.SparseSegmentSumGrad(
      grad=grads, indices=index, segment_ids=segments, output_dim0=num_rows
    )
  return tf.math.unsorted_segment_sum(
    tf.gather(grads, segments) * scale[:, tf.newaxis], index, num_rows
  )
