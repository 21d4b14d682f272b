"""Turns one feature's input (dense, sparse, ragged, padded) into flat bags.

Every backend that computes lookups itself works on one canonical form, the
`FlatBags`: three parallel 1-D tensors (ids, the output segment each id
contributes to, its weight) plus the number of segments. A non-sequence
feature has one segment per batch row; a sequence feature of length L has
`B * L` segments (row `b`, position `p` -> segment `b * L + p`). Combining is
then one `unsorted_segment_sum`, for every input kind and combiner.

This module also applies the id policy (`validate`: id range, weights) and
the host-side static padding (`pad_bags`) that gives compiled steps fixed
shapes; the checks of types, ranks and weights that every engine shares are
`backends.input_checks`.
"""

import dataclasses
from typing import Any

import tensorflow as tf

from backends import input_checks as checks_lib
from backends.input_checks import (  # noqa: F401  (public names of this module)
  ID_POLICIES,
  FeatureLayout,
  InvalidInputError,
  PaddedBags,
  check_bag_structure,
  describe,
)


@dataclasses.dataclass
class FlatBags:
  """One feature's ids in canonical flat form.

  Attributes:
    ids: int64 `[N]` row ids.
    segments: int32 `[N]` output segment of each id.
    weights: float32 `[N]` per-id weights (1 where none were given).
    num_segments: scalar int32, `B` or `B * L`.
    batch_size: scalar int32 `B`.
    sequence_length: 0, or `L` for sequence outputs `[B, L, D]`.
    truncated: scalar int64, ids dropped because their bag or sequence was
      longer than the static width.
    capacity: a static upper bound on the number of ids (static batch size
      times static width), or None when the input's shape is dynamic.
    slots: int64 scalar, the same bound when the step runs (batch size times
      width), or None when bags have no width (ragged or sparse without
      `bag_width`): equal in every step whose inputs have equal shapes.
    unit_weights: True when no weights were given, so every weight is 1 by
      construction (lets the lookup skip multiplying by them).
    single_ids: True when no bag can hold more than one id (a dense or
      padded input of static width 1): every combiner then gives a unit
      weight factor 1.
    sorted_segments: True when `segments` is non-decreasing by construction
      (dense, ragged and padded inputs; not SparseTensors, whose indices need
      not be in canonical order), which sorted segment reductions need.
    ids_in_range: True when the op that made `ids` already failed on any id
      outside `[0, vocabulary_size)` (`to_flat_bags(check_ids=True)`), so
      `validate`'s "error" policy has nothing left to check.
    dropped: when the op that made `ids` already left out every id outside
      `[0, vocabulary_size)` (`to_flat_bags(drop_ids=True)`), how many
      (int64 scalar): `validate`'s "drop" policy has nothing left to do.
  """

  ids: tf.Tensor
  segments: tf.Tensor
  weights: tf.Tensor
  num_segments: tf.Tensor
  batch_size: tf.Tensor
  sequence_length: int
  truncated: tf.Tensor
  capacity: int | None = None
  slots: tf.Tensor | None = None
  unit_weights: bool = False
  single_ids: bool = False
  sorted_segments: bool = False
  ids_in_range: bool = False
  dropped: tf.Tensor | None = None


def _positions_in_rows(row_ids: tf.Tensor, row_starts: tf.Tensor) -> tf.Tensor:
  """Position of each value within its row, given each row's first index."""
  n = tf.shape(row_ids, out_type=tf.int64)[0]
  return tf.range(n, dtype=tf.int64) - tf.gather(row_starts, row_ids)


def _lexsort(rows: tf.Tensor, cols: tf.Tensor) -> tf.Tensor:
  """The permutation that sorts entries by (row, column), ties kept in order."""
  by_col = tf.argsort(cols, stable=True)
  return tf.gather(by_col, tf.argsort(tf.gather(rows, by_col), stable=True))


def canonical_order(
  inp: tf.SparseTensor, weights: tf.SparseTensor | None
) -> "tuple[tf.SparseTensor, tf.SparseTensor | None]":
  """`inp` (and its weights) with indices in row-major order.

  TF's sparse ops assume canonical order, but many producers (hand-built
  indices, concatenated batches) do not give it: read unordered, ids land in
  other rows' bags. One O(N) pass checks the order; the entries are sorted
  (stably, so weights stay on their ids) only when it is broken.
  """
  rows, cols = inp.indices[:, 0], inp.indices[:, 1]
  ordered = tf.reduce_all(
    tf.logical_or(
      rows[1:] > rows[:-1],
      tf.logical_and(rows[1:] == rows[:-1], cols[1:] >= cols[:-1]),
    )
  )
  if tf.executing_eagerly() and bool(ordered):
    return inp, weights
  n = tf.shape(rows)[0]
  perm = tf.cond(ordered, lambda: tf.range(n), lambda: _lexsort(rows, cols))

  def permuted(sp):
    return tf.SparseTensor(
      tf.gather(sp.indices, perm), tf.gather(sp.values, perm), sp.dense_shape
    )

  return permuted(inp), (permuted(weights) if weights is not None else None)


def rank_in_row(rows: tf.Tensor, num_rows: Any) -> tf.Tensor:
  """Each entry's position among its row's entries (rows sorted, in range)."""
  n = tf.shape(rows, out_type=tf.int64)[0]
  index = tf.range(n, dtype=tf.int64)
  first = tf.math.unsorted_segment_min(index, rows, num_rows)
  return index - tf.gather(first, rows)


def to_flat_bags(
  layout: FeatureLayout,
  inp: Any,
  weights: Any = None,
  bag_width: int | None = None,
  fused_ops: Any | None = None,
  check_ids: bool = False,
  drop_ids: bool = False,
) -> FlatBags:
  """Converts one feature's input to `FlatBags` (validating types and ranks).

  Args:
    layout: the feature's config and names.
    inp: int ids: `tf.Tensor` `[B]` or `[B, N]`, `tf.SparseTensor` `[B, None]`,
      `tf.RaggedTensor` `[B, None]`, or `PaddedBags` from `pad_bags`.
    weights: None, or float weights of the same kind and shape as `inp`.
    bag_width: keep at most this many ids per bag (non-sequence features);
      extra ids are counted in `FlatBags.truncated`.
    fused_ops: the fused CPU kernels (`backends.tensorcore.kernels.load()`), to
      flatten `PaddedBags` in one op; None: TF ops (any device).
    check_ids: with `fused_ops`, the op flattening `PaddedBags` also fails on
      an id outside `[0, vocabulary_size)`, with the message of `validate`'s
      "error" policy in a graph (the result's `ids_in_range` then says so).
    drop_ids: with `fused_ops`, the op flattening `PaddedBags` leaves out the
      ids outside `[0, vocabulary_size)` (the "drop" policy; the result's
      `dropped` counts them).

  Raises:
    InvalidInputError: unsupported type, rank or dtype; misplaced weights.
  """
  checks_lib.check_weights(layout, inp, weights)
  checks = check_bag_structure(describe(layout), inp, weights)
  if checks and isinstance(inp, tf.SparseTensor):
    with tf.control_dependencies(checks):  # rows checked before they index
      inp = tf.SparseTensor(
        tf.identity(inp.indices), inp.values, inp.dense_shape
      )
  seq_len = layout.sequence_length
  out_shape = layout.output_shape(None)
  cut = tf.constant(0, tf.int64)
  ids_in_range = False
  dropped = None
  single_ids = False
  if isinstance(inp, PaddedBags):
    single_ids = inp.ids.shape.rank == 2 and inp.ids.shape[1] == 1
    ids_in_range = check_ids and fused_ops is not None
    drop = drop_ids and fused_ops is not None and not ids_in_range
    ids, row, pos, w, cut, dropped = _from_padded(
      layout, inp, fused_ops, ids_in_range, drop
    )
  elif isinstance(inp, tf.SparseTensor):
    checks_lib.check_sparse_ids(layout, inp)
    if bag_width and not seq_len and out_shape is None:
      # A bag is its row's ids, wherever their columns: the first `bag_width`
      # of them in column order are kept (gaps are not ids).
      inp, weights = canonical_order(inp, weights)
      row = inp.indices[:, 0]
      pos = rank_in_row(row, inp.dense_shape[0])
    else:  # a sequence's column is its position
      row, pos = inp.indices[:, 0], inp.indices[:, 1]
    ids = inp.values
    w = weights.values if weights is not None else None
  elif isinstance(inp, tf.RaggedTensor):
    checks_lib.check_ragged_ids(layout, inp)
    ids = inp.values
    row = tf.cast(inp.value_rowids(), tf.int64)
    # Positions matter only where bags are cut or sequences laid out.
    pos = (
      _positions_in_rows(row, tf.cast(inp.row_splits[:-1], tf.int64))
      if seq_len or bag_width or out_shape is not None
      else None
    )
    w = weights.values if weights is not None else None
  elif isinstance(inp, (tf.Tensor, tf.Variable)) or tf.is_tensor(inp):
    inp = checks_lib.dense_ids(layout, inp)
    single_ids = inp.shape[1] == 1
    shape = tf.shape(inp, out_type=tf.int64)
    width = shape[1]
    ids = tf.reshape(inp, [-1])
    flat = tf.range(tf.size(ids, out_type=tf.int64), dtype=tf.int64)
    row, pos = flat // width, flat % width
    w = None
  else:
    raise checks_lib.unsupported_kind(layout, inp)

  ids = tf.cast(ids, tf.int64)
  unit_weights = w is None
  if w is None:
    w = tf.ones_like(ids, dtype=tf.float32)
  else:
    w = tf.cast(w, tf.float32)
    tf.debugging.assert_equal(
      tf.size(w),
      tf.size(ids),
      message=f"{describe(layout)}: weights and ids have different numbers "
      "of values; weights must have exactly the ids' shape",
    )
  batch_size = _batch_size(inp)

  if out_shape is not None:
    seq_len = checks_lib.sequence_length_from_output_shape(
      layout, out_shape, batch_size
    )
  limit = seq_len if seq_len > 0 else bag_width
  truncated = cut
  if (
    isinstance(inp, PaddedBags)
    and limit
    and inp.ids.shape[1] is not None
    and inp.ids.shape[1] <= limit
  ):
    limit_cut = False  # padded no wider than the limit: nothing to cut
  else:
    limit_cut = bool(limit)
  if limit_cut:
    keep = pos < limit
    truncated += tf.reduce_sum(tf.cast(tf.logical_not(keep), tf.int64))
    ids, row, pos, w = (tf.boolean_mask(t, keep) for t in (ids, row, pos, w))
  capacity = _static_capacity(inp, limit)
  if seq_len > 0:
    segments = row * seq_len + pos
    num_segments = batch_size * seq_len
  else:
    segments = row
    num_segments = batch_size
  return FlatBags(
    ids=ids,
    segments=tf.cast(segments, tf.int32),
    weights=w,
    num_segments=tf.cast(num_segments, tf.int32),
    batch_size=tf.cast(batch_size, tf.int32),
    sequence_length=seq_len,
    truncated=truncated,
    capacity=capacity,
    slots=_slots(inp, limit, batch_size),
    unit_weights=unit_weights,
    single_ids=single_ids,
    sorted_segments=not isinstance(inp, tf.SparseTensor),
    ids_in_range=ids_in_range,
    dropped=dropped,
  )


def _static_capacity(inp: Any, limit: int | None) -> int | None:
  """Most ids `inp` can hold after cutting bags to `limit`, if static."""
  if isinstance(inp, PaddedBags):
    batch, width = inp.ids.shape.as_list()
  elif isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
    batch, width = inp.shape[0], None
  else:  # dense [B] was reshaped to [B, 1] above
    batch, width = tf.convert_to_tensor(inp).shape.as_list()[:2]
  if limit:
    width = min(width, limit) if width is not None else limit
  if batch is None or width is None:
    return None
  return batch * width


def _slots(inp: Any, limit: int | None, batch_size: tf.Tensor):
  """Most ids `inp` can hold after cutting bags to `limit`, as a tensor."""
  if isinstance(inp, PaddedBags):
    width = tf.shape(inp.ids, out_type=tf.int64)[1]
  elif isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
    if not limit:
      return None
    width = tf.constant(limit, tf.int64)
  else:  # dense [B] was reshaped to [B, 1] above
    width = tf.shape(inp, out_type=tf.int64)[1]
  if limit:
    width = tf.minimum(width, limit)
  return tf.cast(batch_size, tf.int64) * width


def _batch_size(inp: Any) -> tf.Tensor:
  if isinstance(inp, PaddedBags):
    return tf.shape(inp.ids, out_type=tf.int64)[0]
  if isinstance(inp, tf.SparseTensor):
    return inp.dense_shape[0]
  if isinstance(inp, tf.RaggedTensor):
    return inp.nrows(out_type=tf.int64)
  return tf.shape(inp, out_type=tf.int64)[0]


def _from_padded(
  layout: FeatureLayout,
  padded: PaddedBags,
  fused_ops=None,
  check_ids: bool = False,
  drop_ids: bool = False,
):
  """Flat (ids, row, pos, weights, cut, dropped) of the real entries of
  padded bags.

  `check_ids` (fused ops only): the op fails on an id outside the table;
  `drop_ids` (fused ops only): it leaves them out and counts them in
  `dropped` (else None).
  """
  checks_lib.check_id_dtype(layout, padded.ids)
  no_weights = padded.weights.shape.rank == 2 and padded.weights.shape[1] == 0
  if fused_ops is not None:
    in_table = check_ids or drop_ids
    ids, row, pos, w, cut, dropped = fused_ops.recsys_padded_bags(
      ids=tf.cast(padded.ids, tf.int64),
      # int32 or int64 as given: the op reads both (no Cast op).
      lengths=(
        padded.lengths
        if padded.lengths.dtype in (tf.int32, tf.int64)
        else tf.cast(padded.lengths, tf.int64)
      ),
      weights=tf.cast(padded.weights, tf.float32),
      vocabulary_size=(
        layout.feature.table.vocabulary_size if in_table else -1
      ),
      # As `input_checks.check` words it in a graph (backticks for quotes).
      feature=describe(layout).replace("'", "`") if check_ids else "",
      drop=drop_ids,
    )
    weights = None if no_weights else w
    return ids, row, pos, weights, cut, dropped if drop_ids else None
  lengths = tf.cast(padded.lengths, tf.int64)
  width = tf.shape(padded.ids, out_type=tf.int64)[1]
  # One `where` of the real entries, then gathers: cheaper than a mask each.
  real = tf.where(tf.range(width)[tf.newaxis, :] < lengths[:, tf.newaxis])
  cut = tf.reduce_sum(tf.maximum(lengths - width, 0))
  # Weights of static width 0 are `pad_bags`' mark for "no weights" (all 1).
  weights = None if no_weights else tf.gather_nd(padded.weights, real)
  ids = tf.gather_nd(padded.ids, real)
  return ids, real[:, 0], real[:, 1], weights, cut, None


def validate(
  layout: FeatureLayout, bags: FlatBags, policy: str
) -> "tuple[FlatBags, tf.Tensor]":
  """Applies the id policy and checks weights; returns (bags, invalid count).

  Args:
    layout: the feature.
    bags: its flat bags.
    policy: "error" raises on an id outside [0, vocabulary_size) naming the
      feature, table, id and batch row; "drop" removes such ids; "oov" maps
      them to the last row (`vocabulary_size - 1`, reserve it for OOV).

  Returns:
    The bags with the policy applied, and the number of invalid ids (int64).
  """
  if policy not in ID_POLICIES:
    raise ValueError(f"unknown id policy {policy!r}; use one of {ID_POLICIES}.")
  vocab = layout.feature.table.vocabulary_size
  what = checks_lib.template_safe(describe(layout))
  ids, w = bags.ids, bags.weights
  checks = []
  if not bags.unit_weights:  # ones by construction need no check
    bad_w = tf.logical_not(tf.logical_and(tf.math.is_finite(w), w >= 0.0))
    checks += checks_lib.check(
      tf.logical_not(tf.reduce_any(bad_w)),
      what + " got weight {}; weights must be finite and >= 0.",
      lambda: [checks_lib.first_where(bad_w, w)],
    )
  if policy == "drop" and bags.dropped is not None:
    # The op that flattened the bags left the ids outside the table out.
    if checks:
      with tf.control_dependencies(checks):
        bags = dataclasses.replace(bags, ids=tf.identity(ids))
    return bags, bags.dropped
  if policy == "error" and bags.ids_in_range:
    # The op that flattened the bags checked every id: nothing left to count.
    if checks:
      with tf.control_dependencies(checks):
        ids = tf.identity(ids)
      bags = dataclasses.replace(bags, ids=ids)
    return bags, tf.constant(0, tf.int64)
  bad = tf.logical_or(ids < 0, ids >= vocab)
  num_bad = tf.reduce_sum(tf.cast(bad, tf.int64))
  if policy == "error":

    def bad_id_and_row():
      row = checks_lib.first_where(bad, bags.segments)
      if bags.sequence_length:
        row = row // bags.sequence_length
      return [checks_lib.first_where(bad, ids), row]

    checks += checks_lib.check_ids_in_range(
      layout, tf.equal(num_bad, 0), bad_id_and_row
    )
  if checks:  # none inside a CheckGroup, whose caller orders them
    with tf.control_dependencies(checks):  # checked before a gather reads ids
      ids = tf.identity(ids)
  if policy == "drop":
    keep = tf.logical_not(bad)
    return dataclasses.replace(
      bags,
      ids=tf.boolean_mask(ids, keep),
      segments=tf.boolean_mask(bags.segments, keep),
      weights=tf.boolean_mask(w, keep),
    ), num_bad
  if policy == "oov":
    ids = tf.where(bad, tf.constant(vocab - 1, tf.int64), ids)
  return dataclasses.replace(bags, ids=ids), num_bad


def pad_bags(
  inp: Any, weights: Any, width: int, what: str = "bags", sequence: bool = False
) -> PaddedBags:
  """Pads a sparse or ragged `[B, None]` bag to static `[B, width]` on the host.

  Ids past `width` are cut; `lengths` keeps the true bag lengths so the
  lookup counts what was cut. Run it in the input pipeline so the
  compiled step sees fixed shapes. `what` names the feature in errors.

  A `SparseTensor` may come in any order (it is put in row-major order when
  it is not). A bag's ids are its row's ids in column order, whatever gaps
  lie between their columns. For a sequence (`sequence=True`) a column is a
  position: a row's first `width` ids must sit at columns 0, 1, 2, ... (a
  gap or a repeated column has no padded layout); ids after them are cut.

  Raises:
    InvalidInputError: (eager; a failed step in graph mode) bad indices,
      misplaced weights, or a sequence with a gap or a repeated column.
  """
  checks = check_bag_structure(what, inp, weights)
  if isinstance(inp, tf.SparseTensor):
    with tf.control_dependencies(checks):  # rows checked before they index
      inp = tf.SparseTensor(
        tf.identity(inp.indices), inp.values, inp.dense_shape
      )
    inp, weights = canonical_order(inp, weights)
    rows, cols = inp.indices[:, 0], inp.indices[:, 1]
    nrows = inp.dense_shape[0]
    values = inp.values
    if sequence:
      # The first `width` ids of a row must sit at columns 0 .. width-1; the
      # ones after them (columns >= width) are cut, as a ragged row's are.
      rank = rank_in_row(rows, nrows)
      misplaced = tf.logical_and(
        tf.logical_or(rank < width, cols < width), tf.not_equal(cols, rank)
      )
      checks += checks_lib.check(
        tf.logical_not(tf.reduce_any(misplaced)),
        checks_lib.template_safe(what)
        + " is a sequence but batch row {} has an id "
        "at column {} where position {} comes next; a sequence's ids must "
        "fill columns 0, 1, 2, ... of their row (no gaps, no repeats) to be "
        "padded. Pass it as a RaggedTensor, or to lookup() without "
        "preprocess() (a gap is then a zero row).",
        lambda: [
          checks_lib.first_where(misplaced, rows),
          checks_lib.first_where(misplaced, cols),
          checks_lib.first_where(misplaced, rank),
        ],
      )
    with tf.control_dependencies(checks):
      values = tf.identity(values)
    inp = tf.RaggedTensor.from_value_rowids(values, rows, nrows=nrows)
    if weights is not None:
      weights = tf.RaggedTensor.from_value_rowids(
        weights.values, rows, nrows=nrows
      )
  if not isinstance(inp, tf.RaggedTensor):
    raise InvalidInputError(
      "pad_bags takes SparseTensor or RaggedTensor bags, got "
      f"{type(inp).__name__}."
    )
  batch = inp.nrows()
  ids = inp.to_tensor(default_value=0, shape=[batch, width])
  if weights is None:
    # Static width 0 marks "no weights" (all 1): the lookup then skips them.
    w = tf.zeros_like(ids[:, :0], dtype=tf.float32)
  else:
    w = tf.cast(weights, tf.float32).to_tensor(
      default_value=0.0, shape=[batch, width]
    )
  lengths = tf.cast(
    inp.row_lengths(), tf.int32
  )  # true lengths: cuts are counted
  return PaddedBags(ids=ids, lengths=lengths, weights=w)
