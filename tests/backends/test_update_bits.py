"""An optimizer update's bits do not depend on how many rows one call updates.

Issue 52: inside a `tf.function` TF rewrote Adagrad's and Adam's
`x / sqrt(y)` into `x * rsqrt(y)`, whose CPU kernel rounds a value in a SIMD
lane and in the scalar tail differently, so a row-sharded shard (its own
rows) and a replicated table (all rows at once) could store different
bits. References: the same rows updated in one call, in calls of 1, 7 and
17 rows, and by the fused C++ kernels. A compiled update is not among
them: XLA on a CPU always fuses `a - b * c` into one multiply-add (one
rounding instead of two, as a TPU's compiler may), and which ones depends
on the shapes it compiles for, so compiled steps equal these within a few
ulps (cancellations in FTRL make a few ulps of a small value).
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import optimizers
from backends.tensorcore import kernels

E = tf.tpu.experimental.embedding
ROWS, DIM = 100, 13

OPTIMIZERS = {
  "sgd": lambda: E.SGD(0.1),
  "adagrad": lambda: E.Adagrad(0.1),
  "adam": lambda: E.Adam(0.01),
  "adam_sqrt_plus_eps": lambda: E.Adam(0.01, sum_inside_sqrt=False),
  "adagrad_momentum": lambda: E.AdagradMomentum(0.1, momentum=0.9),
  "ftrl": lambda: E.FTRL(0.1, l1_regularization_strength=0.01),
}


def _update(opt_name, per_call, jit=False, fused=False):
  """Table and slots after two updates of every row, `per_call` at a time."""
  optimizer = OPTIMIZERS[opt_name]()
  rng = np.random.default_rng(0)
  table = tf.Variable(rng.normal(size=(ROWS, DIM)).astype(np.float32))
  slots = {
    name: tf.Variable(
      init((ROWS, DIM), dtype=tf.float32), name=name, trainable=False
    )
    for name, init in optimizers.slot_initializers(optimizer).items()
  }
  grads = rng.normal(size=(2, ROWS, DIM)).astype(np.float32)
  fused_ops = kernels.load() if fused else None

  @tf.function(jit_compile=jit)
  def update(ids, g):
    if fused_ops is None:
      optimizers.apply_sparse_update(optimizer, table, slots, ids, g)
    else:
      optimizers.apply_sparse_updates(
        optimizer,
        [optimizers.SparseUpdate(table, slots, ids, g)],
        fused_ops=fused_ops,
      )

  for g in grads:
    for start in range(0, ROWS, per_call):
      ids = np.arange(start, min(ROWS, start + per_call))
      update(tf.constant(ids, tf.int64), tf.constant(g[ids]))
  return [table.numpy()] + [slots[n].numpy() for n in sorted(slots)]


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_rows_per_call_leave_the_same_bits(opt_name):
  whole = _update(opt_name, ROWS)
  for per_call in (1, 7, 17):
    for got, want in zip(_update(opt_name, per_call), whole):
      np.testing.assert_array_equal(got, want, f"{per_call} rows per call")
  for got, want in zip(_update(opt_name, 7, jit=True), whole):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt_name", ["sgd", "adagrad", "adam"])
def test_the_fused_kernels_leave_the_tf_ops_bits(opt_name):
  if kernels.load() is None:
    pytest.skip(
      "the fused kernels did not build here (backends.tensorcore.kernels)"
    )
  for got, want in zip(
    _update(opt_name, 17, fused=True), _update(opt_name, ROWS)
  ):
    np.testing.assert_array_equal(got, want)
