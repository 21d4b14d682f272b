"""float64 math whose every bit is fixed by its input, on any CPU.

TF's transcendental ops (`log`, `ndtri`, `pow`, ...) are vectorized: a value
computed in a SIMD register's body and the same value in the scalar tail
may round differently, so the result can depend on how many values one call
computes and on the machine's vector width (issue 52: `tf.math.ndtri` gave
the same row 1 ulp apart on an Intel Xeon when a table was split four ways).

The functions here use only operations IEEE 754 rounds correctly — `+`, `-`,
`*`, `/`, `sqrt`, comparisons and bit moves — each as its own TF op (no
fused multiply-add), so a value is the same whatever else is computed with
it, on any CPU, in any call size, and equal bit for bit to the same
sequence of NumPy operations (`tests/backends/test_exact_math.py`).

Example:
  >>> z = exact_math.ndtri(tf.constant([0.025, 0.5], tf.float64))
"""

import tensorflow as tf

_F64 = tf.float64
_LN2 = 0.6931471805599453  # nearest float64 to log(2)
_SQRT2 = 1.4142135623730951
# 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...): the series to s^22, enough for
# float64 at |s| <= 3 - 2 sqrt(2) (the mantissa reduced to [1/sqrt2, sqrt2)).
_ATANH_SERIES = tuple(1.0 / (2 * k + 1) for k in range(12))

# Wichura's AS 241 (Applied Statistics 37(3), 1988): the normal quantile as
# rational functions, accurate to about 1e-16. Central region |p - 0.5| <=
# 0.425, in r = 0.180625 - (p - 0.5)^2: numerator, denominator (constant
# term first).
_CENTRAL = (
  (
    3.3871328727963666080,
    1.3314166789178437745e2,
    1.9715909503065514427e3,
    1.3731693765509461125e4,
    4.5921953931549871457e4,
    6.7265770927008700853e4,
    3.3430575583588128105e4,
    2.5090809287301226727e3,
  ),
  (
    1.0,
    4.2313330701600911252e1,
    6.8718700749205790830e2,
    5.3941960214247511077e3,
    2.1213794301586595867e4,
    3.9307895800092710610e4,
    2.8729085735721942674e4,
    5.2264952788528545610e3,
  ),
)
# Tails with r = sqrt(-log(min(p, 1 - p))) <= 5, in r - 1.6. AS 241's third
# region (r > 5, p < 1.4e-11) is not needed: `ndtri`'s domain stops first.
_TAIL = (
  (
    1.42343711074968357734,
    4.63033784615654529590,
    5.76949722146069140550,
    3.64784832476320460504,
    1.27045825245236838258,
    2.41780725177450611770e-1,
    2.27238449892691845833e-2,
    7.74545014278341407640e-4,
  ),
  (
    1.0,
    2.05319162663775882187,
    1.67638483018380384940,
    6.89767334985100004550e-1,
    1.48103976427480074590e-1,
    1.51986665636164571966e-2,
    5.47593808499534494600e-4,
    1.05075007164441684324e-9,
  ),
)
#: `ndtri` is defined for `p` in `[NDTRI_MIN_P, 1 - NDTRI_MIN_P]` (r <= 5).
NDTRI_MIN_P = 1.4e-11


def polynomial(x: tf.Tensor, coefficients: tuple[float, ...]) -> tf.Tensor:
  """`sum(c[k] * x**k)` by Horner's rule, one rounding per `*` and `+`."""
  result = tf.fill(tf.shape(x), tf.constant(coefficients[-1], _F64))
  for c in reversed(coefficients[:-1]):
    result = tf.add(tf.multiply(result, x), c)
  return result


def log(x: tf.Tensor) -> tf.Tensor:
  """Natural log of positive, normal float64 `x` (not 0, inf or subnormal).

  `x = m * 2**e` with `m` in `[1/sqrt2, sqrt2)`, read off the bits; then
  `log m = 2 atanh((m - 1) / (m + 1))` as a series. Error about 2e-16.
  """
  bits = tf.bitcast(tf.convert_to_tensor(x, _F64), tf.int64)
  exponent = tf.bitwise.right_shift(bits, 52) - 1023
  mantissa = tf.bitcast(
    tf.bitwise.bitwise_or(
      tf.bitwise.bitwise_and(bits, (1 << 52) - 1), tf.constant(1023 << 52)
    ),
    _F64,
  )
  halve = mantissa > _SQRT2
  mantissa = tf.where(halve, mantissa * 0.5, mantissa)
  exponent = exponent + tf.cast(halve, tf.int64)
  f = mantissa - 1.0  # exact (Sterbenz): m is within a factor 2 of 1
  s = f / (f + 2.0)
  log_mantissa = 2.0 * s * polynomial(s * s, _ATANH_SERIES)
  return tf.cast(exponent, _F64) * _LN2 + log_mantissa


def ndtri(p: tf.Tensor) -> tf.Tensor:
  """The standard normal quantile of float64 `p` (AS 241).

  `p` must lie in `[NDTRI_MIN_P, 1 - NDTRI_MIN_P]`; agrees with
  `tf.math.ndtri` to about 1e-15. The tails (|p - 0.5| > 0.425, 15 % of
  uniform `p`) are computed apart, on just their values: a data-dependent
  shape, so this is for host code, not a compiled step.
  """
  p = tf.convert_to_tensor(p, _F64)
  q = p - 0.5
  r = 0.180625 - q * q
  z = q * polynomial(r, _CENTRAL[0]) / polynomial(r, _CENTRAL[1])
  in_tail = tf.where(tf.abs(q) > 0.425)
  tail_p = tf.gather_nd(p, in_tail)
  t = tf.sqrt(-log(tf.minimum(tail_p, 1.0 - tail_p))) - 1.6
  tail = polynomial(t, _TAIL[0]) / polynomial(t, _TAIL[1])
  tail = tf.where(tail_p < 0.5, -tail, tail)
  return tf.tensor_scatter_nd_update(z, in_tail, tail)
