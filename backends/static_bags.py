"""Static-shape lookups and row gradients for compiled steps (XLA, TPU).

On a TPU every replica step is compiled by XLA, and XLA wants every shape
fixed when it compiles. The generic path of `backends.tensorcore.backend` cannot
be
compiled: `tf.unique`, `boolean_mask` and `where` have data-dependent sizes,
and the `SparseSegment*` ops have no XLA kernel. This module is the same
lookup written for a compiler:

* Every feature becomes `StaticBags`: its ids, a `valid` mask and a scale
  (weight over the combiner's normaliser) per slot, of a size fixed by the
  input's shape (`[B, W]` padded bags, dense ids, the values of a ragged
  tensor). Padding, cut and invalid ids are slots with `valid` False and
  scale 0: they are never looked up and never touch a row.
* De-duplication sorts the ids into a fixed capacity (`dedup`): the `N`
  slots hold the distinct valid ids first, in ascending order; the unused
  slots repeat slot 0 (same id, same gradient, so the same update: scatters
  write one value per row and stay deterministic).
* Combining is a reshape-sum for rectangular bags and `unsorted_segment_sum`
  otherwise; the row gradients are its transpose.

The math is the generic path's: for every combiner, weight and input kind
the activations and per-row gradients agree up to the order of float sums.

Example:
  >>> bags = from_input(layout, padded_bags, None, bag_width=None)
  >>> bags = with_combiner_scale(validate(layout, bags, "error")[0], "mean")
  >>> dd = dedup(bags.ids, bags.valid, vocabulary_size=1000)
  >>> rows = tf.gather(table, dd.ids)                  # [N, D]
  >>> acts = combine(rows, dd.index, bags)             # [S, D]
"""

import dataclasses
from typing import Any, NamedTuple

import tensorflow as tf

from backends import _bags
from backends import input_checks as checks_lib
from backends import inputs as inputs_lib
from backends.errors import BackendError


class StaticShapeError(BackendError, ValueError):
  """A feature's input has no size a compiled step can be built for."""

  # Raised while a tf.function traces: AutoGraph re-raises an error with its
  # own type only if the type's __init__ is Exception's (else StagingError).
  __init__ = Exception.__init__


@dataclasses.dataclass
class StaticBags:
  """One feature's ids in slots of a size fixed by the input's shape.

  Attributes:
    ids: int64 `[N]`; any value where not `valid`.
    valid: bool `[N]`, the slots that hold a real id.
    segments: int32 `[N]`, the output row (`[S]`) of each slot.
    scale: float32 `[N]`, d(activation)/d(row) of each slot; 0 where not valid.
    weights: float32 `[N]`, the raw per-id weights (1 where none were given).
    num_segments: `S` (`B`, or `B * L` for sequences); a Python int when the
      shape is static at trace time, else a scalar that XLA folds from shapes.
    width: `W` when the slots are a rectangle `[S, W]` (slot `i` belongs to
      segment `i // W`), else None.
    sequence_length: 0, or `L` for `[B, L, D]` outputs.
    truncated: int64 scalar, ids cut because a bag or sequence was too long.
  """

  ids: tf.Tensor
  valid: tf.Tensor
  segments: tf.Tensor
  scale: tf.Tensor
  weights: tf.Tensor
  num_segments: Any
  width: int | None
  sequence_length: int
  truncated: tf.Tensor

  @property
  def capacity(self) -> int | None:
    """The number of slots if static at trace time."""
    return self.ids.shape[0]


def _static_or_dynamic(dim: int | None, dynamic: tf.Tensor):
  return dim if dim is not None else dynamic


def _rectangle(layout, ids, lengths, weights, limit: int | None):
  """Slots of padded or dense `[B, W]` ids whose first `lengths` are real."""
  width = ids.shape[1]
  seq_len = layout.sequence_length
  cut = tf.constant(0, tf.int64)
  if limit is not None:
    keep = min(width, limit)
    cut = tf.reduce_sum(tf.maximum(tf.cast(lengths, tf.int64) - keep, 0))
    ids, weights = ids[:, :keep], weights[:, :keep]
    if seq_len and keep < seq_len:  # a sequence shorter than L: zero rows
      pad = [[0, 0], [0, seq_len - keep]]
      ids, weights = tf.pad(ids, pad), tf.pad(weights, pad)
    width = ids.shape[1]
  real = (
    tf.range(width, dtype=tf.int64)[tf.newaxis, :]
    < tf.cast(lengths, tf.int64)[:, tf.newaxis]
  )
  batch = _static_or_dynamic(ids.shape[0], tf.shape(ids)[0])

  def flat(t):
    return tf.reshape(t, [-1])

  if seq_len:  # one segment per (row, position)
    n = flat(ids).shape[0] if ids.shape.is_fully_defined() else tf.size(ids)
    segments = tf.range(n, dtype=tf.int32)
    return (
      flat(ids),
      flat(real),
      segments,
      flat(weights),
      batch * seq_len,
      1,
      cut,
    )
  segments = tf.repeat(tf.range(batch, dtype=tf.int32), width)
  return flat(ids), flat(real), segments, flat(weights), batch, width, cut


def _static_batch(layout, inp) -> Any:
  """The batch size of a sparse input, which must be static to compile."""
  batch = inp.shape[0]
  if batch is None:
    raise StaticShapeError(
      f"{checks_lib.describe(layout)}: a SparseTensor without a static "
      "batch size cannot be looked up in a compiled step (its dense_shape "
      "is a value, not a shape). Set bag_widths for this feature and run "
      "the backend's preprocess() in the input pipeline (static [B, W] "
      "bags), or batch with drop_remainder=True."
    )
  return batch


def from_input(
  layout: checks_lib.FeatureLayout,
  inp: Any,
  weights: Any,
  bag_width: int | None,
) -> StaticBags:
  """One feature's input as `StaticBags` (types and ranks validated).

  Args:
    layout: the feature.
    inp: dense `[B]`/`[B, N]` ids, `PaddedBags`, or a `RaggedTensor` /
      `SparseTensor` `[B, None]` (their number of values fixes the size).
    weights: None or float weights of the same kind as `inp`.
    bag_width: keep at most this many ids per bag (non-sequence features).

  Returns:
    The bags with each slot's scale its raw weight; `with_combiner_scale`
    turns it into the combiner's factor (after `validate`).

  Raises:
    InvalidInputError: unsupported type, rank or dtype; misplaced weights.
    StaticShapeError: an input whose size is not a shape (see `_static_batch`).
  """
  checks_lib.check_weights(layout, inp, weights)
  seq_len = layout.sequence_length
  limit = seq_len or bag_width
  out_shape = layout.output_shape(None)
  if isinstance(inp, checks_lib.PaddedBags):
    checks_lib.check_id_dtype(layout, inp.ids)
    no_weights = inp.weights.shape.rank == 2 and inp.weights.shape[1] == 0
    w = (
      tf.ones_like(inp.ids, tf.float32)
      if no_weights
      else tf.cast(inp.weights, tf.float32)
    )
    parts = _rectangle(
      layout, tf.cast(inp.ids, tf.int64), inp.lengths, w, limit or None
    )
  elif isinstance(inp, (tf.RaggedTensor, tf.SparseTensor)):
    parts = _flat_bags(layout, inp, weights, limit or None)
  else:
    inp = checks_lib.dense_ids(layout, inp)
    lengths = tf.fill([tf.shape(inp)[0]], tf.shape(inp, out_type=tf.int64)[1])
    parts = _rectangle(
      layout,
      tf.cast(inp, tf.int64),
      lengths,
      tf.ones_like(inp, tf.float32),
      limit or None,
    )
  ids, valid, segments, w, num_segments, width, cut = parts
  if out_shape is not None:
    num_segments, width, seq_len = _apply_output_shape(
      layout, out_shape, num_segments, width
    )
  bags = StaticBags(
    ids=ids,
    valid=valid,
    segments=segments,
    scale=w,
    weights=w,
    num_segments=num_segments,
    width=width,
    sequence_length=seq_len,
    truncated=cut,
  )
  return bags


def _apply_output_shape(layout, out_shape, num_segments, width):
  """`output_shape`'s reading of a batch: combined, or a sequence of it."""
  batch = tf.get_static_value(tf.convert_to_tensor(num_segments))
  if batch is None or layout.sequence_length:
    return num_segments, width, layout.sequence_length
  seq = checks_lib.sequence_length_from_output_shape(
    layout, out_shape, tf.constant(int(batch), tf.int64)
  )
  if seq == 0:
    return num_segments, width, 0
  raise StaticShapeError(
    f"{checks_lib.describe(layout)}: output_shape={out_shape} asks for a "
    f"sequence of the batch; give the feature max_sequence_length={seq} "
    "instead, which compiled steps support."
  )


def _flat_bags(layout, inp, weights, limit: int | None):
  """Slots of a ragged or sparse `[B, None]` input, one per value."""
  if isinstance(inp, tf.SparseTensor):
    checks_lib.check_sparse_ids(layout, inp)
    batch = _static_batch(layout, inp)
    if limit is not None and not layout.sequence_length:
      # A bag's first `limit` ids in column order are kept, gaps or not.
      inp, weights = inputs_lib.canonical_order(inp, weights)
    ids, row, pos = inp.values, inp.indices[:, 0], inp.indices[:, 1]
    if limit is not None and not layout.sequence_length:
      # Rows outside the batch (left out below) rank in a segment of their own.
      outside = tf.logical_or(row < 0, row >= batch)
      pos = inputs_lib.rank_in_row(
        tf.where(outside, tf.cast(batch, tf.int64), row), batch + 1
      )
    # Only rows inside the batch count; the generic path refuses the rest.
    in_batch = tf.logical_and(row >= 0, row < batch)
    pos_ok = pos >= 0
  else:
    checks_lib.check_ragged_ids(layout, inp)
    batch = _static_or_dynamic(inp.shape[0], tf.shape(inp.row_splits)[0] - 1)
    ids = inp.values
    row = tf.cast(inp.value_rowids(), tf.int64)
    starts = tf.cast(inp.row_splits[:-1], tf.int64)
    pos = tf.range(tf.shape(ids, out_type=tf.int64)[0]) - tf.gather(starts, row)
    in_batch = tf.ones_like(row, tf.bool)
    pos_ok = in_batch
  w = (
    tf.ones_like(ids, tf.float32)
    if weights is None
    else tf.cast(weights.values, tf.float32)
  )
  valid = tf.logical_and(in_batch, pos_ok)
  cut = tf.constant(0, tf.int64)
  if limit is not None:
    too_far = pos >= limit
    cut = tf.reduce_sum(tf.cast(tf.logical_and(valid, too_far), tf.int64))
    valid = tf.logical_and(valid, tf.logical_not(too_far))
  row = tf.clip_by_value(row, 0, tf.cast(batch, tf.int64) - 1)
  seq_len = layout.sequence_length
  if seq_len:
    pos = tf.clip_by_value(pos, 0, seq_len - 1)
    segments, num_segments = row * seq_len + pos, batch * seq_len
  else:
    segments, num_segments = row, batch
  return (
    tf.cast(ids, tf.int64),
    valid,
    tf.cast(segments, tf.int32),
    w,
    num_segments,
    None,
    cut,
  )


# -- validation -----------------------------------------------------------


class Report(NamedTuple):
  """What `validate` found in one feature's ids and weights, per replica."""

  bad_ids: tf.Tensor  # int64 scalar: ids outside [0, vocabulary_size)
  example: tf.Tensor  # int64 [2]: one bad id and its batch row, or zeros
  bad_weights: tf.Tensor  # int64 scalar: weights NaN, inf or negative


def validate(
  layout: checks_lib.FeatureLayout, bags: StaticBags, policy: str
) -> "tuple[StaticBags, Report]":
  """Applies the id policy without leaving the compiled step.

  A compiled step cannot raise, so nothing bad is ever read: ids outside
  `[0, vocabulary_size)` become empty slots ("error", "drop") or the last row
  ("oov"); slots with a NaN, infinite or negative weight become empty. The
  `Report` says what was found; the backend keeps it in counters that
  `raise_for_invalid_inputs()` turns into the generic path's error.
  """
  vocab = layout.feature.table.vocabulary_size
  valid = bags.valid
  bad = tf.logical_and(valid, tf.logical_or(bags.ids < 0, bags.ids >= vocab))
  bad_w = tf.logical_and(
    valid,
    tf.logical_not(
      tf.logical_and(tf.math.is_finite(bags.weights), bags.weights >= 0.0)
    ),
  )

  def count(m):
    return tf.reduce_sum(tf.cast(m, tf.int64))

  # One slot past the end (found when no slot is bad): safe with no slots.
  first = tf.argmax(
    tf.concat([tf.cast(bad, tf.int32), [1]], 0), output_type=tf.int32
  )

  def padded(t):
    return tf.concat([t, tf.zeros([1], t.dtype)], 0)

  row = tf.cast(tf.gather(padded(bags.segments), first), tf.int64)
  if bags.sequence_length:
    row //= bags.sequence_length
  any_bad = tf.reduce_any(bad)
  example = tf.where(
    any_bad,
    tf.stack([tf.gather(padded(bags.ids), first), row]),
    tf.zeros([2], tf.int64),
  )
  ids = bags.ids
  if policy == "oov":
    ids = tf.where(bad, tf.constant(vocab - 1, tf.int64), ids)
  else:
    valid = tf.logical_and(valid, tf.logical_not(bad))
  valid = tf.logical_and(valid, tf.logical_not(bad_w))
  bags = dataclasses.replace(bags, ids=ids, valid=valid)
  return bags, Report(count(bad), example, count(bad_w))


# -- combining ------------------------------------------------------------


def _segment_sum(values: tf.Tensor, bags: StaticBags) -> tf.Tensor:
  """Per-segment sums of per-slot `values` (`[N]` or `[N, D]`)."""
  if bags.width is not None:
    shape = tf.concat([[-1, bags.width], tf.shape(values)[1:]], 0)
    return tf.reduce_sum(tf.reshape(values, shape), axis=1)
  return tf.math.unsorted_segment_sum(values, bags.segments, bags.num_segments)


def _per_slot(per_segment: tf.Tensor, bags: StaticBags) -> tf.Tensor:
  """Broadcasts a per-segment `[S]`/`[S, D]` tensor to the slots."""
  if bags.width is not None:
    return tf.repeat(per_segment, bags.width, axis=0)
  return tf.gather(per_segment, bags.segments)


def with_combiner_scale(bags: StaticBags, combiner: str) -> StaticBags:
  """Sets each slot's scale: its weight over its bag's normaliser (0: empty)."""
  scale = _bags.combiner_scale(
    tf.where(bags.valid, bags.weights, 0.0),
    combiner,
    bool(bags.sequence_length),
    lambda v: _segment_sum(v, bags),
    lambda v: _per_slot(v, bags),
  )
  return dataclasses.replace(bags, scale=scale)


class Dedup(NamedTuple):
  """Distinct ids in a fixed capacity (see `dedup`)."""

  ids: tf.Tensor  # int64 [N]: distinct valid ids, then repeats of slot 0
  index: tf.Tensor  # int32 [N]: each input slot's unique slot
  num_unique: tf.Tensor  # int32 scalar K: slots [0, K) are distinct valid ids


#: `dedup` marks rows in a `[V]` vector instead of sorting when V is at most
#: this many times the number of ids: O(V + N) beats XLA's CPU sort there
#: (16k ids of a 200k-row table: ~0.5 vs ~6.5 ms). Same result either way.
_MARK_RATIO = 32


def dedup(ids: tf.Tensor, valid: tf.Tensor, vocabulary_size: int) -> Dedup:
  """De-duplicates the valid ids into as many slots as there are ids.

  `tf.unique` has only dynamic sizes. Here the first `K` unique slots are the
  distinct valid ids in ascending order, found by one sort, or for small
  tables by marking rows in a `[V]` vector and counting marks (the same
  layout). Unique slots from `K` on repeat slot 0 (row 0 if there is no
  valid id), so every slot names a real row. Invalid input slots point at
  slot `K` or later: callers give them scale 0.
  """
  n_static = ids.shape[0]
  if n_static is not None and vocabulary_size <= _MARK_RATIO * max(n_static, 1):
    return _dedup_by_marking(ids, valid, vocabulary_size)
  n = tf.shape(ids)[0]
  # 32-bit keys sort faster (XLA's CPU sort: ~2x); ties need no order.
  key_type = tf.int32 if vocabulary_size < 2**31 - 1 else tf.int64
  key = tf.where(
    valid, tf.cast(ids, key_type), tf.constant(vocabulary_size, key_type)
  )
  order = tf.argsort(key)
  sorted_key = tf.gather(key, order)
  is_new = tf.concat(
    [tf.ones([1], tf.bool)[:n], sorted_key[1:] != sorted_key[:-1]], 0
  )
  slot_of_sorted = tf.cumsum(tf.cast(is_new, tf.int32)) - 1
  index = tf.scatter_nd(order[:, tf.newaxis], slot_of_sorted, [n])
  real_new = tf.logical_and(is_new, sorted_key < vocabulary_size)
  num_unique = tf.reduce_sum(tf.cast(real_new, tf.int32))
  # Each unique slot's id; slots no sorted id lands in stay 0.
  unique = tf.cast(
    tf.tensor_scatter_nd_max(
      tf.zeros_like(key), slot_of_sorted[:, tf.newaxis], sorted_key
    ),
    tf.int64,
  )
  first = tf.where(num_unique > 0, unique[:1], tf.zeros([1], tf.int64)[:n])
  unique = tf.where(tf.range(n) < num_unique, unique, first)
  return Dedup(unique, index, num_unique)


def _dedup_by_marking(
  ids: tf.Tensor, valid: tf.Tensor, vocabulary_size: int
) -> Dedup:
  """`dedup` through a `[V + 1]` mark vector (row V: the invalid slots)."""
  n = tf.shape(ids)[0]
  key = tf.where(valid, tf.cast(ids, tf.int32), vocabulary_size)
  marks = tf.tensor_scatter_nd_max(
    tf.zeros([vocabulary_size + 1], tf.int32),
    key[:, tf.newaxis],
    tf.ones_like(key),
  )
  slot_of_row = tf.cumsum(marks) - 1  # ascending rows, then row V
  num_unique = slot_of_row[vocabulary_size - 1] + 1
  index = tf.gather(slot_of_row, key)
  unique = tf.cast(
    tf.tensor_scatter_nd_max(
      tf.zeros([n], tf.int32), index[:, tf.newaxis], key
    ),
    tf.int64,
  )
  first = tf.where(num_unique > 0, unique[:1], tf.zeros([1], tf.int64)[:n])
  unique = tf.where(tf.range(n) < num_unique, unique, first)
  return Dedup(unique, index, num_unique)


def pad_rows(values: tf.Tensor, num_unique: tf.Tensor) -> tf.Tensor:
  """Makes unique slots from `num_unique` on repeat slot 0's row (`dedup`)."""
  real = tf.range(tf.shape(values)[0]) < num_unique
  values = tf.where(real[:, tf.newaxis], values, tf.zeros_like(values))
  return tf.where(real[:, tf.newaxis], values, values[:1])


def combine(rows: tf.Tensor, index: tf.Tensor, bags: StaticBags) -> tf.Tensor:
  """Activations `[S, D]`: the sum over slots of `scale * rows[index]`."""
  per_slot = tf.gather(rows, index) * bags.scale[:, tf.newaxis]
  return _segment_sum(per_slot, bags)


def row_gradients(
  grads: list[tf.Tensor], bags: list[StaticBags], index: tf.Tensor, capacity
) -> tf.Tensor:
  """d(loss)/d(row) per unique slot, `[N, D]`: `combine`'s transpose.

  Args:
    grads: per feature, d(loss)/d(activations) as `[S_f, D]`.
    bags: the features' bags, in the order their slots were concatenated.
    index: the unique slot of every slot (all features).
    capacity: `N`, the number of unique slots.
  """
  per_slot = [
    _per_slot(g, b) * b.scale[:, tf.newaxis] for g, b in zip(grads, bags)
  ]
  per_slot = tf.concat(per_slot, 0) if len(per_slot) > 1 else per_slot[0]
  return tf.math.unsorted_segment_sum(per_slot, index, capacity)
