"""Counter-based random numbers in TF ops: fixed per (seed, stream, index).

Synthetic sources draw every random quantity of example `i` from a hash of
`(key, i)`, where the key names the seed, the stream (train/eval/...) and the
column. An example is therefore the same whatever the batch size, the number
of input pipelines or the order in which batches are generated, and batches
can be generated in parallel without any RNG state. The hash is Chris
Wellons' `lowbias32` (two rounds per draw, 32-bit lanes, 24-bit uniforms).
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

_M1 = 0x21F0AAAD
_M2 = 0xD35A2D97
_MASK = 0xFFFFFFFF


def mix32_py(x: int) -> int:
  """`lowbias32` on a Python int (used to derive keys)."""
  x &= _MASK
  x ^= x >> 16
  x = (x * _M1) & _MASK
  x ^= x >> 15
  x = (x * _M2) & _MASK
  x ^= x >> 15
  return x


def make_key(*parts: int | str) -> int:
  """A 32-bit key from ints and strings, e.g. `make_key(seed, "train", col)`."""
  key = 0x9E3779B9
  for part in parts:
    if isinstance(part, str):
      for ch in part.encode("utf-8"):
        key = mix32_py(key ^ ch)
      key = mix32_py(key ^ 0xFF)
    else:
      part = int(part)
      key = mix32_py(key ^ (part & _MASK))
      key = mix32_py(key ^ ((part >> 32) & _MASK))
  return key


def _mix32(x: tf.Tensor) -> tf.Tensor:
  x = tf.bitwise.bitwise_xor(
    x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32))
  )
  x = x * tf.constant(_M1, tf.uint32)
  x = tf.bitwise.bitwise_xor(
    x, tf.bitwise.right_shift(x, tf.constant(15, tf.uint32))
  )
  x = x * tf.constant(_M2, tf.uint32)
  return tf.bitwise.bitwise_xor(
    x, tf.bitwise.right_shift(x, tf.constant(15, tf.uint32))
  )


def hash32(
  keys: Sequence[int] | np.ndarray | tf.Tensor, index: tf.Tensor
) -> tf.Tensor:
  """Hashes `index` under each key.

  Args:
    keys: uint32-valued keys, broadcastable against `index` (e.g. `[1, C]`
      against `[N, 1]`), as Python ints, a NumPy array or a uint32 tensor.
    index: int64 (non-negative) counters, e.g. example indices `[N, 1]`.

  Returns:
    uint32 tensor, the broadcast shape of `keys` and `index`.
  """
  if not isinstance(keys, tf.Tensor):
    keys = tf.constant(np.asarray(keys, dtype=np.uint32))
  index = tf.cast(index, tf.int64)
  lo = tf.cast(
    tf.bitwise.bitwise_and(index, tf.constant(_MASK, tf.int64)), tf.uint32
  )
  hi = tf.cast(
    tf.bitwise.right_shift(index, tf.constant(32, tf.int64)), tf.uint32
  )
  h = _mix32(tf.bitwise.bitwise_xor(lo, keys))
  return _mix32(
    tf.bitwise.bitwise_xor(h, tf.bitwise.bitwise_xor(hi, _mix32(keys)))
  )


def uniform(keys, index: tf.Tensor) -> tf.Tensor:
  """Uniform float32 in [0, 1) with 24 random bits, one per (key, index)."""
  bits = tf.bitwise.right_shift(hash32(keys, index), tf.constant(8, tf.uint32))
  return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))


def uniform_open(keys, index: tf.Tensor) -> tf.Tensor:
  """Uniform float32 in (0, 1] (never 0): safe under `log`."""
  bits = tf.bitwise.right_shift(hash32(keys, index), tf.constant(8, tf.uint32))
  return (tf.cast(bits, tf.float32) + 0.5) * (1.0 / (1 << 24))


def logistic(u: tf.Tensor) -> tf.Tensor:
  """Standard logistic variates at unit variance, from `uniform()` output.

  Computed from the 24-bit integer behind `u` as log(k + 1/2) - log(2^24 - k
  - 1/2), which stays finite at both ends (1 - u would round to 0 in float32).
  """
  k = u * float(1 << 24)
  return (
    tf.math.log(k + 0.5) - tf.math.log(float(1 << 24) - 0.5 - k)
  ) * np.float32(np.sqrt(3.0) / np.pi)


def normal(keys_a, keys_b, index: tf.Tensor) -> tf.Tensor:
  """Standard normal float32 by Box-Muller from two independent key sets."""
  u1 = uniform_open(keys_a, index)
  u2 = uniform(keys_b, index)
  return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * np.pi * u2)


def symmetric(keys, index: tf.Tensor) -> tf.Tensor:
  """Uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1, cheaper than normal."""
  return (uniform(keys, index) * 2.0 - 1.0) * np.float32(np.sqrt(3.0))


def zipf_rank(
  u: tf.Tensor, num_ranks: np.ndarray | int, exponent: float
) -> tf.Tensor:
  """Maps uniforms to ranks in [0, num_ranks), P(rank r) ~ (r + 1)^-exponent.

  A discretised bounded power law: the inverse CDF of the density
  `x^-exponent` on `[1, num_ranks + 1)`, floored. It matches Zipf's law up to
  the discretisation of the head and needs no per-rank table, so it works for
  any vocabulary size (computed in float32: ranks beyond ~2^24 are coarse).

  Args:
    u: uniforms in [0, 1), any shape.
    num_ranks: int or int array broadcastable against `u` (e.g. one per column).
    exponent: the Zipf exponent s >= 0 (0 gives uniform ranks).

  Returns:
    int64 ranks shaped like `u`.
  """
  u = tf.cast(u, tf.float32)
  n = np.asarray(num_ranks, np.float64)
  if exponent == 0.0:
    x = 1.0 + u * n.astype(np.float32)
  elif abs(exponent - 1.0) < 1e-9:
    x = tf.exp(u * np.log1p(n).astype(np.float32))
  else:
    a = 1.0 - exponent
    span = ((n + 1.0) ** a - 1.0).astype(np.float32)
    x = tf.exp(tf.math.log1p(u * span) * np.float32(1.0 / a))
  rank = tf.cast(x, tf.int64) - 1
  return tf.clip_by_value(
    rank, tf.constant(0, tf.int64), (n.astype(np.int64) - 1)
  )


def zipf_pmf(num_ranks: int, exponent: float) -> np.ndarray:
  """The exact probabilities of `zipf_rank`'s ranks, float64 `[num_ranks]`."""
  edges = np.arange(1, num_ranks + 2, dtype=np.float64)
  if exponent == 0.0:
    cdf = (edges - 1.0) / num_ranks
  elif abs(exponent - 1.0) < 1e-9:
    cdf = np.log(edges) / np.log1p(num_ranks)
  else:
    a = 1.0 - exponent
    cdf = (edges**a - 1.0) / ((num_ranks + 1.0) ** a - 1.0)
  return np.diff(cdf)


def coprime_multiplier(n: int, key: int) -> int:
  """A multiplier coprime to n, so `(r * m + c) % n` permutes [0, n)."""
  if n <= 2:
    return 1
  m = (key % (n - 1)) + 1
  while np.gcd(m, n) != 1:
    m = m % (n - 1) + 1
  return m
