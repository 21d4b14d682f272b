"""Narrow tables: rows stored in bfloat16 or float16, math in float32.

A table its layout stores in bfloat16 or float16 (`TableLayout.dtype`,
`backends.layout`; TF's `TableConfig` takes float32 only) keeps its rows
in that dtype (half the bytes of float32); its optimizer slots stay
float32. Lookups upcast the rows to float32 for the model; the
optimizer's update is computed in float32 and written back with
stochastic rounding: each
value becomes one of its two narrow neighbours, the upper one with
probability equal to its distance from the lower one, so a rounding is
unbiased on average and updates smaller than half a narrow step still move
the rows. The random draw is a counter-based hash of (seed, update step,
row, column): the same seed and the same steps give bit-identical tables,
on every replica and compiled or not.

At its limits (the largest finite value: float16's 65504, bfloat16's
3.39e38) a narrow table saturates and counts, in training and in
restores alike: a finite value beyond it becomes it, with its sign (never
inf: TF's cast would give inf, and a resumed run would then fail on a
NaN loss blaming a batch); infinities and NaN stay as they are (the
training-health checks catch those). An update counts the values it
saturated per table (`Saturation`); a restore that would saturate is
refused unless asked (`NarrowRangeError`, `backends.checkpoint`).

Example:
  >>> rounding = Rounding(seed=7, counter=tf.Variable(0, dtype=tf.int64))
  >>> narrow_rows = rounding.round(new_rows, tf.bfloat16, ids)
"""

import dataclasses
import logging
import zlib
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from backends.errors import BackendError

log = logging.getLogger("recsys.backends")

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


def largest_finite(dtype: Any) -> float:
  """The largest finite value of `dtype` (float16: 65504)."""
  return float(tf.as_dtype(dtype).max)


def beyond_range(values: tf.Tensor, dtype: Any) -> tf.Tensor:
  """bool: the finite `values` whose magnitude exceeds `dtype`'s largest
  finite value (those a narrow table saturates)."""
  limit = tf.constant(largest_finite(dtype), values.dtype)
  return tf.logical_and(tf.math.is_finite(values), tf.abs(values) > limit)


def saturate(values: tf.Tensor, dtype: Any) -> tf.Tensor:
  """`values` with each finite value beyond `dtype`'s range replaced by
  the largest finite value, with its sign (exact in `dtype`: any rounding
  into `dtype` keeps it); infinities and NaN unchanged."""
  limit = tf.constant(largest_finite(dtype), values.dtype)
  return tf.where(
    beyond_range(values, dtype),
    tf.where(values < 0, -limit, limit),
    values,
  )


def cast(values: Any, dtype: Any) -> tf.Tensor:
  """`values` in `dtype`: into a narrow dtype rounded to nearest, saturated
  at its range (never a finite value turned inf), else TF's cast."""
  values = tf.convert_to_tensor(values)
  dtype = tf.as_dtype(dtype)
  if dtype in _NARROW and values.dtype.size > dtype.size:
    values = saturate(values, dtype)
  return tf.cast(values, dtype)


def saturated(
  values: tf.Tensor, dtype: Any, counted: tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
  """`(count, largest)`: how many of `values` `dtype` saturates (int64) and
  the largest magnitude among them (float32; 0 when none).

  `counted`: bool `[U]`, the rows to count (None: all).
  """
  beyond = beyond_range(values, dtype)
  if counted is not None:
    beyond = tf.logical_and(beyond, counted[:, tf.newaxis])
  count = tf.reduce_sum(tf.cast(beyond, tf.int64))
  magnitude = tf.where(beyond, tf.abs(values), tf.zeros_like(values))
  largest = tf.maximum(tf.reduce_max(magnitude), 0)  # 0 for no values
  return count, tf.cast(largest, tf.float32)


def saturated_in(values: np.ndarray, dtype: Any) -> tuple[int, float]:
  """`saturated` of a NumPy array (a restore's chunk), in NumPy."""
  values = np.asarray(values)
  magnitude = np.abs(values[np.isfinite(values)])
  beyond = magnitude[magnitude > largest_finite(dtype)]
  return int(beyond.size), float(beyond.max()) if beyond.size else 0.0


class NarrowRangeError(BackendError, ValueError):
  """A restore into a narrow table would saturate values (beyond its range)."""


def range_message(
  table: str, dtype: Any, count: int, largest: float, source: str
) -> str:
  """What a refused restore says: the table, the values beyond its dtype's
  range and how to restore anyway."""
  dtype = tf.as_dtype(dtype)
  wider = "bfloat16 or float32" if dtype == tf.float16 else "float32"
  return (
    f"table {table!r}: {source} holds {count} value(s) beyond {dtype.name}'s "
    f"range (+-{largest_finite(dtype):g}), the largest {largest:g}; "
    f"restored into this {dtype.name} table they would become "
    f"+-{largest_finite(dtype):g}. Nothing was restored. Restore into a "
    f"table of wider range (EmbeddingPlacement.table_dtype: {wider}), or "
    "saturate them on purpose: the backend option saturate_restores=True "
    "(e.g. train.backend_options = {'saturate_restores': True}), or "
    "backends.checkpoint.restore(..., saturate=True)."
  )


def warn_saturated_restore(
  table: str, dtype: str, count: int, largest: float, source: str
) -> None:
  """Warns that a restore (asked to) saturated `count` values."""
  log.warning(
    "table %r: restoring %s saturated %d value(s) beyond %s's range "
    "(+-%g) to +-%g, the largest %g (saturate_restores=True)",
    table,
    source,
    count,
    dtype,
    largest_finite(dtype),
    largest_finite(dtype),
    largest,
  )


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
  that probability. Finite values beyond the dtype's largest finite value
  saturate to it (`saturate`: float16's neighbour above 65504 is inf,
  drawn with probability 0; a bfloat16 carry would reach inf).
  Infinities and NaN stay.
  """
  if dtype == tf.bfloat16:
    value_bits = tf.bitcast(saturate(values, dtype), tf.uint32)
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
class Saturation:
  """A narrow table's saturated values so far, as variables (not
  checkpointed: they count what this process's updates saturated).

  Attributes:
    count: int64 scalar variable, the values the table's updates saturated
      (`saturated`); per replica.
    largest: float32 scalar variable, the largest magnitude among them.
  """

  count: Any
  largest: Any

  def record(self, count: tf.Tensor, largest: tf.Tensor) -> None:
    """Adds an update's `saturated` result."""
    self.count.assign_add(tf.cast(count, tf.int64), read_value=False)
    self.largest.assign(
      tf.maximum(self.largest.read_value(), largest), read_value=False
    )


class SaturatedValues(NamedTuple):
  """What a narrow table's updates saturated so far (`read_saturation`)."""

  values: int  # how many values were saturated
  largest: float  # the largest magnitude among them (0: none)
  dtype: str  # the table's


def read_saturation(
  saturation: Saturation, strategy: tf.distribute.Strategy, dtype: Any
) -> SaturatedValues:
  """A table's `Saturation`: the count as its aggregation reads it (every
  worker calls this together: a row-sharded table's sum is a collective),
  the largest over this worker's replicas."""
  count = int(saturation.count.numpy())
  largest = max(
    float(v.numpy())
    for v in strategy.experimental_local_results(saturation.largest)
  )
  return SaturatedValues(count, largest, tf.as_dtype(dtype).name)


def saturation_variables(
  name: str, aggregation: tf.VariableAggregation
) -> Saturation:
  """A table's `Saturation` variables, one per replica (`ON_READ`):
  `aggregation` ONLY_FIRST_REPLICA for a replicated table (every copy
  counts the same values), SUM for a row-sharded one (each its rows)."""

  def variable(suffix: str, dtype: tf.DType) -> tf.Variable:
    return tf.Variable(
      tf.zeros([], dtype),
      trainable=False,
      name=f"{name}_{suffix}",
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=aggregation,
    )

  return Saturation(
    variable("saturated", tf.int64), variable("saturated_largest", tf.float32)
  )


def rounding_step_variable(name: str) -> tf.Variable:
  """Table `name`'s count of rounded updates, one per replica (`ON_READ`),
  each advanced identically (not checkpointed)."""
  return tf.Variable(
    0,
    dtype=tf.int64,
    trainable=False,
    name=f"{name}_rounding_step",
    synchronization=tf.VariableSynchronization.ON_READ,
    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
  )


@dataclasses.dataclass
class Rounding:
  """How one narrow table's updates are rounded: a seed and a step counter.

  Attributes:
    seed: the table's rounding seed (`table_seed`).
    counter: int64 scalar variable, the table's updates so far (one per
      replica, each advanced identically; not checkpointed: a restored run
      counts again from 0, deterministically).
    saturation: where the updates count the values they saturate (None:
      not counted).
  """

  seed: int
  counter: Any
  saturation: Saturation | None = None

  #: Whether the fused kernels may round these updates: they key each draw
  #: by the row id they index with, which must be the table's own row id.
  fused: bool = dataclasses.field(default=True, init=False)

  def next_step(self) -> tf.Tensor:
    """Advances the counter: this update's step (int64 scalar), which the
    fused kernels (`backends.tensorcore.kernels`) take as an input to draw the
    same
    bits as `round`."""
    with tf.control_dependencies(
      [self.counter.assign_add(1, read_value=False)]
    ):
      return tf.identity(self.counter.read_value())

  def round(self, values: tf.Tensor, dtype: tf.DType, ids: tf.Tensor):
    """`values` `[U, D]` of rows `ids`, rounded into `dtype` for this update
    (the values it saturates counted, `count_saturated`)."""
    step = self.next_step()
    self.count_saturated(values, dtype, ids)
    bits = random_bits(self.seed, step, ids, int(values.shape[-1]))
    return round_stochastically(values, dtype, bits)

  def count_saturated(
    self, values: tf.Tensor, dtype: tf.DType, ids: tf.Tensor
  ) -> None:
    """Adds the values of rows `ids` that `dtype` saturates to `saturation`.

    `ids` are distinct, or (a fixed-size step's padding, `static_bags`)
    repeat the first row's id with its values: those repeats are not
    counted again.
    """
    if self.saturation is None:
      return
    ids = tf.convert_to_tensor(ids)
    first = tf.range(tf.shape(ids)[0]) == 0
    counted = tf.logical_or(first, tf.not_equal(ids, ids[:1]))
    self.saturation.record(*saturated(values, dtype, counted))

  def record_kernel(self, outputs: Any) -> None:
    """Adds what a fused kernel's update saturated (its `saturated` and
    `largest` outputs) to `saturation`."""
    if self.saturation is not None:
      self.saturation.record(outputs.saturated, outputs.largest)


def table_seed(seed: int, table_name: str) -> int:
  """A table's rounding seed: the backend's `rounding_seed` and its name."""
  return (int(seed) * 0x9E3779B1 + zlib.crc32(table_name.encode())) & _MASK32
