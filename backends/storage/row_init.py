"""Initial table values keyed by row: a row's values depend on its id alone.

TF's initializers draw a whole `[V, D]` tensor at once, so the only way to
give a shard its rows is to draw the whole table and keep a slice: a table
larger than one host cannot start that way, and the values a shard gets
would depend on how the table is split. A `RowInitializer` computes the
values of any set of rows from `(seed, row id, column)` alone, with a
counter-based hash (splitmix64 over `row * D + column`, mixed with the
seed), so

* a replica initializes only its own rows, in chunks of bounded size
  (`fill`): no process ever holds more than its shard plus one chunk;
* a row's starting value is the same replicated or row-sharded, over any
  number of replicas and workers, in any row layout, and in a checkpoint
  read back by another layout — bit for bit on any CPU: normals come from
  the uniforms through `backends.storage.exact_math.ndtri`, made of correctly
  rounded operations only, so no value depends on the vector width or on
  how many rows one call computes (TF's `ndtri` did: issue 52).

The distribution is the table's initializer's (uniform, normal, truncated
normal, variance scaling, constants: `for_table`), not its exact stream: an
initializer this module does not know (a user's function) is called on the
whole shape as before (`for_table` returns None).

Example:
  >>> init = RowInitializer.for_table(table)     # None: not row-keyable
  >>> init.rows(tf.constant([0, 7, 9], tf.int64))   # [3, table.dim]
"""

import dataclasses
import math
import zlib
from typing import Any

import numpy as np
import tensorflow as tf

from backends.storage import exact_math

#: Rows per chunk are chosen so a chunk holds at most this many bytes.
CHUNK_BYTES = 8 << 20


def rows_per_chunk(dim: int, dtype: tf.DType) -> int:
  """Rows of width `dim` in `dtype` a chunk holds (at least one)."""
  return max(1, CHUNK_BYTES // (tf.as_dtype(dtype).size * dim))


#: Rows drawn at once hold at most this many bytes of float32 values: the
#: hash's uint64 and the quantile's float64 intermediates are ~20x that.
DRAW_BYTES = 1 << 20

_U64 = tf.uint64
# TF truncates its truncated normal at two standard deviations.
_TRUNCATE_AT = 2.0
# Phi(-2), the standard normal's mass below -2 (a literal: libm's erf is not
# guaranteed to round alike on every machine).
_MASS_BELOW_TRUNCATION = 0.022750131948179209
# Stddev of a unit normal truncated at +-2 (TF's VarianceScaling constant).
_TRUNCATED_STDDEV = 0.87962566103423978

# Initializer class name -> (scale, mode, distribution) of VarianceScaling.
_VARIANCE_SCALING = {
  "GlorotUniform": (1.0, "fan_avg", "uniform"),
  "GlorotNormal": (1.0, "fan_avg", "truncated_normal"),
  "HeUniform": (2.0, "fan_in", "uniform"),
  "HeNormal": (2.0, "fan_in", "truncated_normal"),
  "LecunUniform": (1.0, "fan_in", "uniform"),
  "LecunNormal": (1.0, "fan_in", "truncated_normal"),
}


def _const(value: int) -> tf.Tensor:
  return tf.constant(value, _U64)


def _mix(z: tf.Tensor) -> tf.Tensor:
  """splitmix64's finalizer: a bijection of uint64 with full avalanche."""
  z = z + _const(0x9E3779B97F4A7C15)
  z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _const(30)))
  z = z * _const(0xBF58476D1CE4E5B9)
  z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _const(27)))
  z = z * _const(0x94D049BB133111EB)
  return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _const(31)))


@tf.function(autograph=False, reduce_retracing=True)
def _uniform(ids: tf.Tensor, dim: int, key: tf.Tensor) -> tf.Tensor:
  """Uniforms in (0, 1) for `[len(ids), dim]` elements, keyed by position."""
  rows = tf.bitcast(tf.cast(ids, tf.int64), _U64)[:, tf.newaxis]
  cols = tf.bitcast(tf.range(dim, dtype=tf.int64), _U64)[tf.newaxis, :]
  z = _mix(tf.bitwise.bitwise_xor(rows * _const(dim) + cols, key))
  top = tf.cast(tf.bitwise.right_shift(z, _const(40)), tf.float32)  # 24 bits
  return (top + 0.5) * np.float32(2.0**-24)


@dataclasses.dataclass(frozen=True)
class RowInitializer:
  """The values of any rows of a `[vocabulary_size, dim]` table.

  Attributes:
    dim: the table's width.
    distribution: "constant", "uniform", "normal" or "truncated_normal".
    a, b: the distribution's parameters: the value (constant), `[a, b)`
      (uniform), mean and stddev (normal; truncated at 2 stddev).
    seed: the table's key (the initializer's seed, else one derived from
      the table's name and TF's global seed).
  """

  dim: int
  distribution: str
  a: float
  b: float
  seed: int

  @classmethod
  def for_table(cls, table: Any) -> "RowInitializer | None":
    """The row-keyed form of `table.initializer`, or None if it has none."""
    return from_initializer(
      table.initializer,
      (table.vocabulary_size, table.dim),
      default_seed(table.name or ""),
    )

  def rows(self, ids: tf.Tensor) -> tf.Tensor:
    """float32 `[len(ids), dim]`: the initial values of rows `ids`.

    Every value is a function of `(seed, id, column)` computed with
    correctly rounded operations only (`backends.storage.exact_math`), on the
    host
    CPU: the same bits on every CPU and in calls of any size.
    """
    ids = tf.convert_to_tensor(ids, tf.int64)
    if self.distribution == "constant":
      return tf.fill(tf.stack([tf.size(ids), self.dim]), np.float32(self.a))
    with tf.device("/device:CPU:0"):
      return _rows(ids, self.dim, _mix_seed(self.seed), self)

  def chunk_rows(self) -> int:
    """Rows drawn at once: `DRAW_BYTES` of float32 rows, at least one."""
    return max(1, DRAW_BYTES // (4 * self.dim))

  def fill(self, variable: Any, ids: Any, device: str | None = None) -> None:
    """Assigns the rows `ids` (int64, one per variable row) chunk by chunk.

    Row `k` of `variable` gets the values of table row `ids[k]`; `ids` may
    be a NumPy array or a `(start, stop, step)` range of table rows. Peak
    memory beyond the variable: one draw (`DRAW_BYTES` of values and the
    hash's intermediates, ~20 MiB).
    """
    count = _count(ids)
    step = self.chunk_rows()
    with tf.device(device):
      for begin in range(0, count, step):
        end = min(count, begin + step)
        # A scatter: a slice assignment copies a variable whole once TF has
        # put it in copy-on-read mode (any sparse access does).
        variable.scatter_update(
          tf.IndexedSlices(
            tf.cast(self.rows(_slice(ids, begin, end)), variable.dtype),
            tf.range(begin, end, dtype=tf.int64),
          )
        )


def _rows(ids: tf.Tensor, dim: int, key: int, init: RowInitializer):
  u = _uniform(ids, dim, _const(key))
  if init.distribution == "uniform":
    return np.float32(init.a) + np.float32(init.b - init.a) * u
  return _normal(
    u,
    tf.constant(init.a, tf.float64),
    tf.constant(init.b, tf.float64),
    init.distribution == "truncated_normal",
  )


@tf.function(autograph=False, reduce_retracing=True)
def _normal(u: tf.Tensor, mean: tf.Tensor, stddev: tf.Tensor, truncated: bool):
  """Normals from uniforms by the inverse CDF, optionally cut at +-2."""
  p = tf.cast(u, tf.float64)  # exact: u has 24 significant bits
  if truncated:
    lo = _MASS_BELOW_TRUNCATION
    p = lo + (1.0 - 2.0 * lo) * p
  z = exact_math.ndtri(p)
  if truncated:
    z = tf.clip_by_value(z, -_TRUNCATE_AT, _TRUNCATE_AT)
  return tf.cast(mean + stddev * z, tf.float32)


def _count(ids: Any) -> int:
  if isinstance(ids, range):
    return len(ids)
  return int(np.shape(ids)[0])


def _slice(ids: Any, begin: int, end: int) -> tf.Tensor:
  if isinstance(ids, range):
    part = ids[begin:end]
    return tf.range(part.start, part.stop, part.step, dtype=tf.int64)
  return tf.constant(np.asarray(ids[begin:end], np.int64))


def default_seed(table_name: str) -> int:
  """A table's key when its initializer has no seed: from its name.

  TF's global seed (`tf.random.set_seed`) enters it, so runs that set one
  differ by it as TF's own initializers would; every process and replica
  derives the same key.
  """
  global_seed, _ = tf.compat.v1.get_seed(None)
  name_hash = zlib.crc32(table_name.encode("utf-8"))
  return name_hash ^ ((int(global_seed or 0) & 0xFFFFFFFF) << 32)


def _mix_seed(seed: int) -> int:
  """A 64-bit key from a seed (seeds 0, 1, 2 ... far apart)."""
  z = (int(seed) + 0x9E3779B97F4A7C15) & (2**64 - 1)
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
  return z ^ (z >> 31)


def from_initializer(
  initializer: Any, shape: tuple[int, int], fallback_seed: int
) -> RowInitializer | None:
  """The row-keyed form of a Keras/TF initializer for a table of `shape`.

  Knows TF's, tf.compat.v1's and Keras's Zeros, Ones, Constant (a scalar),
  RandomUniform, RandomNormal, TruncatedNormal and VarianceScaling (with
  Glorot, He and Lecun); anything else (a function, Orthogonal, Identity, a
  Constant array) returns None.
  """
  name = type(initializer).__name__
  get_config = getattr(initializer, "get_config", None)
  if get_config is None:
    return None
  try:
    config = get_config()
  except (NotImplementedError, TypeError, ValueError):
    return None
  seed = config.get("seed")
  seed = fallback_seed if seed is None else int(seed)
  dim = int(shape[1])

  def make(distribution: str, a: float, b: float) -> RowInitializer:
    return RowInitializer(dim, distribution, float(a), float(b), seed)

  if name in ("Zeros", "zeros_initializer"):
    return make("constant", 0.0, 0.0)
  if name in ("Ones", "ones_initializer"):
    return make("constant", 1.0, 0.0)
  if name in ("Constant", "constant_initializer"):
    value = np.asarray(config.get("value", 0.0))
    return make("constant", float(value), 0.0) if value.ndim == 0 else None
  if name in ("RandomUniform", "random_uniform_initializer"):
    return make("uniform", config["minval"], config["maxval"])
  if name in ("RandomNormal", "random_normal_initializer"):
    return make("normal", config["mean"], config["stddev"])
  if name in ("TruncatedNormal", "truncated_normal_initializer"):
    return make("truncated_normal", config["mean"], config["stddev"])
  if name in _VARIANCE_SCALING:
    scale, mode, distribution = _VARIANCE_SCALING[name]
  elif name == "VarianceScaling":
    scale, mode = config["scale"], config["mode"]
    distribution = config["distribution"]
  else:
    return None
  fan_in, fan_out = float(shape[0]), float(shape[1])
  fan = {"fan_in": fan_in, "fan_out": fan_out}.get(
    mode, (fan_in + fan_out) / 2.0
  )
  scale /= max(1.0, fan)
  if distribution in ("truncated_normal", "normal"):  # v1's "normal"
    return make("truncated_normal", 0.0, math.sqrt(scale) / _TRUNCATED_STDDEV)
  if distribution == "untruncated_normal":
    return make("normal", 0.0, math.sqrt(scale))
  limit = math.sqrt(3.0 * scale)
  return make("uniform", -limit, limit)
