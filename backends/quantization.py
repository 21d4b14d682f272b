"""TF's simulated quantization of looked-up rows (TableConfig field).

On a TPU, a table with a `tf.tpu.experimental.embedding.QuantizationConfig`
has every row it gathers clipped to `[lower, upper]` and rounded to the
nearest of `num_buckets` evenly spaced levels before the combiner, so a
model trains as it will be served from quantized tables; the table itself
stays float32, and the backward pass is unchanged (the row gradients are
those of the unquantized lookup: a straight-through estimator). Every
backend that trains here does the same (`simulate`, in the engines' and
the serving lookup's gather); one that cannot refuses the table.

Example:
  >>> config = tf.tpu.experimental.embedding.QuantizationConfig(3, -1.0, 1.0)
  >>> simulate(tf.constant([[0.4, -2.0, 0.6]]), config)   # [[0., -1., 1.]]
"""

import math
from typing import Any

import tensorflow as tf


def problem(config: Any) -> str | None:
  """Why a quantization config cannot quantize, or None if it can:
  `num_buckets` not an int >= 2, a bound not a finite number, or
  `lower >= upper` (TF checks only the first)."""
  buckets, lower, upper = config.num_buckets, config.lower, config.upper
  if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 2:
    return f"QuantizationConfig(num_buckets={buckets!r}); use an int >= 2."
  bounds = f"QuantizationConfig(lower={lower!r}, upper={upper!r})"
  for bound in (lower, upper):
    if (
      isinstance(bound, bool)
      or not isinstance(bound, (int, float))
      or not math.isfinite(bound)
    ):
      return f"{bounds}; the bounds must be finite numbers."
  if not lower < upper:
    return (
      f"{bounds}; lower must be below upper (the range the rows are "
      "clipped to)."
    )
  return None


def simulate(rows: tf.Tensor, config: Any) -> tf.Tensor:
  """`rows` clipped and rounded to the config's levels; gradients pass as is.

  TF's formula: `floor((clip(x) - lower) / quantum + 0.5) * quantum + lower`
  with `quantum = (upper - lower) / (num_buckets - 1)`, in float32.
  """
  lower = tf.constant(config.lower, tf.float32)
  upper = tf.constant(config.upper, tf.float32)
  quantum = (upper - lower) / float(config.num_buckets - 1)

  @tf.custom_gradient
  def straight_through(x):
    clipped = tf.clip_by_value(x, lower, upper)
    levels = tf.floor((clipped - lower) / quantum + 0.5)
    return levels * quantum + lower, lambda upstream: upstream

  return straight_through(tf.cast(rows, tf.float32))


def quantizer(table: Any) -> Any:
  """`simulate` for `table`'s rows, or None when it is not quantized."""
  config = getattr(table, "quantization_config", None)
  if config is None:
    return None
  return lambda rows: simulate(rows, config)
