"""Narrow tables: rows stored in bfloat16 or float16, math in float32.

A table the backend's `table_dtype` option stores in bfloat16 or float16
(TF's `TableConfig` takes float32 only) keeps its rows in that dtype (half
the bytes of float32); its optimizer slots stay float32. Lookups upcast
the rows to float32 for the model; the optimizer's update is computed in
float32 and written back with stochastic rounding: each
value becomes one of its two narrow neighbours, the upper one with
probability equal to its distance from the lower one, so a rounding is
unbiased on average and updates smaller than half a narrow step still move
the rows. The random draw is a counter-based hash of (seed, update step,
row, column): the same seed and the same steps give bit-identical tables,
on every replica and compiled or not.

Example:
  >>> rounding = Rounding(seed=7, counter=tf.Variable(0, dtype=tf.int64))
  >>> narrow_rows = rounding.round(new_rows, tf.bfloat16, ids)
"""

import dataclasses
import zlib
from typing import Any

import tensorflow as tf

#: The dtypes a table's rows may be stored in, float32 first (the default).
STORAGE_DTYPES = ("float32", "bfloat16", "float16")
_NARROW = (tf.bfloat16, tf.float16)
_MASK32 = 0xFFFFFFFF


def is_narrow(dtype: Any) -> bool:
  """Whether rows of `dtype` are stored narrow (bfloat16 or float16)."""
  return tf.as_dtype(dtype) in _NARROW


def math_dtype(dtype: Any) -> tf.DType:
  """The dtype the optimizer computes a table of `dtype` in."""
  dtype = tf.as_dtype(dtype)
  return tf.float32 if dtype in _NARROW else dtype


def _mix(x: tf.Tensor) -> tf.Tensor:
  """A 32-bit integer hash with full avalanche (`lowbias32`), on uint32."""
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
  x = x * _u32(0x7FEB352D)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(15)))
  x = x * _u32(0x846CA68B)
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def _u32(value: int) -> tf.Tensor:
  return tf.constant(value & _MASK32, tf.uint32)


def _low_high(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """The low and high 32 bits of an int64 tensor, as uint32."""
  x = tf.cast(x, tf.int64)
  low = tf.cast(tf.bitwise.bitwise_and(x, _MASK32), tf.uint32)
  high = tf.cast(
    tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, 32), _MASK32), tf.uint32
  )
  return low, high


def random_bits(
  seed: int, step: tf.Tensor, ids: tf.Tensor, dim: int
) -> tf.Tensor:
  """uint32 `[U, dim]`: a hash of (seed, step, row, column).

  A pure function of its arguments (no TF random state): the same on
  every device, eagerly and under XLA. The full hash runs per row and per
  column; each element then costs an xor and one multiply-xorshift (the
  update's elementwise work is what a narrow table's step pays for).
  """
  step_low, step_high = _low_high(step)
  key = _mix(_u32(int(seed) ^ 0x9E3779B9))
  key = _mix(tf.bitwise.bitwise_xor(key, step_low))
  key = _mix(tf.bitwise.bitwise_xor(key, step_high))
  row_low, row_high = _low_high(ids)
  rows = _mix(tf.bitwise.bitwise_xor(key, row_low))
  rows = _mix(tf.bitwise.bitwise_xor(rows, row_high))
  cols = _mix(tf.cast(tf.range(dim), tf.uint32) + _u32(0x632BE5AB))
  bits = tf.bitwise.bitwise_xor(rows[:, tf.newaxis], cols[tf.newaxis])
  bits = bits * _u32(0x846CA68B)
  return tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, _u32(16)))


def uniforms(bits: tf.Tensor) -> tf.Tensor:
  """float32 in `[0, 1)` from `random_bits` (their top 24 bits, exact)."""
  top = tf.bitwise.right_shift(bits, _u32(8))
  return tf.cast(top, tf.float32) * (2.0**-24)


def round_stochastically(
  values: tf.Tensor, dtype: tf.DType, bits: tf.Tensor
) -> tf.Tensor:
  """`values` (float32) in `dtype`, each rounded up (in magnitude) with
  probability equal to its distance from its lower neighbour in `dtype`
  (in units of the gap between them).

  `bits`: `random_bits` of the shape of `values`. bfloat16 (the top half
  of a float32): the draw's top 16 bits are added to the value's bits and
  the low 16 cut, which carries into the kept bits with exactly that
  probability. float16: the upper neighbour when `uniforms(bits)` is below
  that probability; values beyond the largest finite float16 saturate to
  it. Infinities and NaN stay.
  """
  if dtype == tf.bfloat16:
    value_bits = tf.bitcast(values, tf.uint32)
    carried = value_bits + tf.bitwise.right_shift(bits, _u32(16))
    kept = tf.bitwise.bitwise_and(carried, _u32(0xFFFF0000))
    return tf.cast(tf.bitcast(kept, tf.float32), tf.bfloat16)
  draws = uniforms(bits)
  magnitude = tf.abs(values)
  nearest = tf.cast(magnitude, dtype)
  near_bits = tf.bitcast(nearest, tf.int16)
  # The neighbours below and above `magnitude` (equal if it is exact).
  low_bits = tf.where(
    tf.cast(nearest, tf.float32) > magnitude, near_bits - 1, near_bits
  )
  low = tf.bitcast(low_bits, dtype)
  high = tf.bitcast(low_bits + 1, dtype)
  low32 = tf.cast(low, tf.float32)
  up = (magnitude - low32) / (tf.cast(high, tf.float32) - low32)
  rounded = tf.where(draws < up, high, low)
  return tf.where(values < 0, -rounded, rounded)


@dataclasses.dataclass
class Rounding:
  """How one narrow table's updates are rounded: a seed and a step counter.

  Attributes:
    seed: the table's rounding seed (`table_seed`).
    counter: int64 scalar variable, the table's updates so far (one per
      replica, each advanced identically; not checkpointed: a restored run
      counts again from 0, deterministically).
  """

  seed: int
  counter: Any

  #: Whether the fused kernels may round these updates: they key each draw
  #: by the row id they index with, which must be the table's own row id.
  fused: bool = dataclasses.field(default=True, init=False)

  def next_step(self) -> tf.Tensor:
    """Advances the counter: this update's step (int64 scalar), which the
    fused kernels (`backends.kernels`) take as an input to draw the same
    bits as `round`."""
    with tf.control_dependencies(
      [self.counter.assign_add(1, read_value=False)]
    ):
      return tf.identity(self.counter.read_value())

  def round(self, values: tf.Tensor, dtype: tf.DType, ids: tf.Tensor):
    """`values` `[U, D]` of rows `ids`, rounded into `dtype` for this update."""
    step = self.next_step()
    bits = random_bits(self.seed, step, ids, int(values.shape[-1]))
    return round_stochastically(values, dtype, bits)


def table_seed(seed: int, table_name: str) -> int:
  """A table's rounding seed: the backend's `rounding_seed` and its name."""
  return (int(seed) * 0x9E3779B1 + zlib.crc32(table_name.encode())) & _MASK32
