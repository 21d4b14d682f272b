"""Integer ids from what TFRS's layer accepts: int32, int64 or float ids.

(And a rank-1 `SparseTensor`, which `keras.Input(shape=(), sparse=True)`
gives, is read as bags of at most one id: `[B, 1]`.)

TFRS's tutorials read ids with `tf.strings.to_number`, which gives float32,
and TFRS's layer casts them. A cast alone is silent garbage for a float
that is not a whole number (2.5 -> 2) or too large to be exact (float32
holds every integer only below 2**24: "16777217" parses to 16777216), so
such ids are refused with the feature named. In an XLA-compiled step, which
cannot raise, they become -1, which the backend refuses and counts like any
id outside the table (`raise_for_invalid_inputs`).
"""

from typing import Any

import numpy as np

from backends.inputs import InvalidInputError
from recsys import _tf_internal
from recsys._keras import tf

#: Below this magnitude every integer is exact in the float dtype.
EXACT_INTEGERS_BELOW = {
  tf.bfloat16: 2**8,
  tf.float16: 2**11,
  tf.float32: 2**24,
  tf.float64: 2**53,
}


def integer_ids(ids: Any, what: str) -> Any:
  """`ids` with float values turned into int64 ids (others unchanged).

  Args:
    ids: a feature's ids: a tensor, `SparseTensor`, `RaggedTensor`, NumPy
      array or list.
    what: names the feature in errors ("feature 'movie_id' (table ...)").

  Raises:
    InvalidInputError: (eagerly; a failed step in a graph) a float id that is
      not a whole number or not below the dtype's exact-integer bound, or
      ids that are neither integers nor floats.
  """
  if isinstance(ids, (np.ndarray, list, tuple, float)):
    array = np.asarray(ids)
    if not np.issubdtype(array.dtype, np.floating):
      return ids
    ids = tf.constant(array)
  if isinstance(ids, tf.SparseTensor):
    if ids.shape.rank == 1:
      # `keras.Input(shape=(), sparse=True)` (TFRS's layer tests): a sparse
      # vector over the batch, row b holding 0 or 1 id: bags `[B, 1]`.
      ids = tf.sparse.expand_dims(ids, -1)
    if not ids.values.dtype.is_floating:
      return ids
    return tf.SparseTensor(
      ids.indices, _checked_cast(ids.values, what), ids.dense_shape
    )
  if isinstance(ids, tf.RaggedTensor):
    if not ids.flat_values.dtype.is_floating:
      return ids
    return ids.with_flat_values(_checked_cast(ids.flat_values, what))
  if tf.is_tensor(ids) and ids.dtype.is_floating:
    return _checked_cast(ids, what)
  return ids


def _checked_cast(values: tf.Tensor, what: str) -> tf.Tensor:
  bound = EXACT_INTEGERS_BELOW.get(values.dtype)
  if bound is None:
    raise InvalidInputError(
      f"{what} got ids of dtype {values.dtype.name}; expected int32, int64 "
      "or float ids that hold whole numbers."
    )
  ok = tf.logical_and(
    tf.equal(values, tf.round(values)), tf.abs(values) < bound
  )
  if _tf_internal.in_xla_compilation():
    return tf.where(ok, tf.cast(values, tf.int64), tf.constant(-1, tf.int64))
  head = f"{what} got the float id "
  tail = (
    f"; float ids must be whole numbers below {bound:,} (the integers "
    f"{values.dtype.name} holds exactly). Read ids as integers, e.g. "
    "tf.strings.to_number(x, out_type=tf.int64)."
  )
  if tf.executing_eagerly():
    bad = values[tf.logical_not(ok)]
    if tf.size(bad) > 0:
      raise InvalidInputError(head + repr(float(bad.numpy().flat[0])) + tail)
    return tf.cast(values, tf.int64)
  first_bad = tf.gather(
    tf.reshape(values, [-1]),
    tf.argmin(tf.cast(tf.reshape(ok, [-1]), tf.int32)),
  )
  # Assert's message shows quotes escaped: name the feature in backticks.
  check = tf.debugging.Assert(
    tf.reduce_all(ok),
    [head.replace("'", "`"), first_bad, tail],
    summarize=1,
  )
  with tf.control_dependencies([check]):
    return tf.cast(values, tf.int64)
