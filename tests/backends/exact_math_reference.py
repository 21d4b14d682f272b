"""NumPy twin of `backends.storage.exact_math` and of the row initializer's
hash.

The same operations in the same order, each a separate NumPy ufunc call:
NumPy's loops are not TF's (other SIMD code, other dispatch), so agreement
bit for bit shows every operation rounds correctly and nothing depends on
the vector width. Run with `NPY_DISABLE_CPU_FEATURES` to check a narrower
instruction set.
"""

import numpy as np

from backends.storage import exact_math, row_init

_MASK64 = np.uint64(2**64 - 1)


def polynomial(x, coefficients):
  result = np.full_like(x, coefficients[-1])
  for c in reversed(coefficients[:-1]):
    result = np.add(np.multiply(result, x), c)
  return result


def log(x):
  bits = np.asarray(x, np.float64).view(np.int64)
  exponent = (bits >> 52) - 1023
  mantissa = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(np.float64)
  halve = mantissa > exact_math._SQRT2
  mantissa = np.where(halve, mantissa * 0.5, mantissa)
  exponent = exponent + halve.astype(np.int64)
  f = mantissa - 1.0
  s = f / (f + 2.0)
  log_mantissa = 2.0 * s * polynomial(s * s, exact_math._ATANH_SERIES)
  return exponent.astype(np.float64) * exact_math._LN2 + log_mantissa


def ndtri(p):
  p = np.asarray(p, np.float64)
  q = p - 0.5
  r = 0.180625 - q * q
  z = q * polynomial(r, exact_math._CENTRAL[0])
  z = z / polynomial(r, exact_math._CENTRAL[1])
  tail = np.abs(q) > 0.425
  tp = p[tail]
  t = np.sqrt(-log(np.minimum(tp, 1.0 - tp))) - 1.6
  value = polynomial(t, exact_math._TAIL[0]) / polynomial(
    t, exact_math._TAIL[1]
  )
  z[tail] = np.where(tp < 0.5, -value, value)
  return z


def _mix(z):
  with np.errstate(over="ignore"):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def rows(init: row_init.RowInitializer, ids) -> np.ndarray:
  """`init.rows(ids)` computed by NumPy alone."""
  ids = np.asarray(ids, np.int64).view(np.uint64)[:, None]
  cols = np.arange(init.dim, dtype=np.uint64)[None, :]
  key = np.uint64(row_init._mix_seed(init.seed))
  with np.errstate(over="ignore"):
    z = _mix((ids * np.uint64(init.dim) + cols) ^ key)
  u = ((z >> np.uint64(40)).astype(np.float32) + np.float32(0.5)) * np.float32(
    2.0**-24
  )
  if init.distribution == "constant":
    return np.full(u.shape, np.float32(init.a))
  if init.distribution == "uniform":
    return np.float32(init.a) + np.float32(init.b - init.a) * u
  p = u.astype(np.float64)
  if init.distribution == "truncated_normal":
    lo = row_init._MASS_BELOW_TRUNCATION
    p = lo + (1.0 - 2.0 * lo) * p
  z = ndtri(p.ravel()).reshape(p.shape)
  if init.distribution == "truncated_normal":
    z = np.clip(z, -row_init._TRUNCATE_AT, row_init._TRUNCATE_AT)
  return (init.a + init.b * z).astype(np.float32)
