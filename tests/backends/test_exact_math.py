"""`backends.storage.exact_math` and the row initializer: the same bits
everywhere.

References: NumPy's `log` and TF's `tf.math.ndtri` for accuracy; a NumPy
twin of the same operation sequence (`exact_math_reference`) for the bits,
in this process and in a child whose NumPy runs without its AVX2/AVX-512
code and whose TF runs with oneDNN switched the other way.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from backends.storage import exact_math, row_init
from tests.backends import exact_math_reference as reference

E = tf.tpu.experimental.embedding
K = tf.keras.initializers

# Every probability the row initializer can ask for, and more: the extremes
# of its 24-bit uniforms, both branch boundaries, a dense grid.
_P = np.concatenate(
  [
    np.linspace(exact_math.NDTRI_MIN_P, 1 - exact_math.NDTRI_MIN_P, 100_003),
    [2**-25, 1 - 2**-25, 0.075, 0.925, 0.0749999, 0.5, 0.5 + 2**-30],
  ]
)
_INITIALIZERS = {
  "truncated_normal": K.TruncatedNormal(0.1, 0.4, seed=11),
  "normal": K.RandomNormal(-1.0, 2.0, seed=4),
  "uniform": K.RandomUniform(-0.5, 1.5, seed=3),
}


def _init(kind: str, dim: int = 13) -> row_init.RowInitializer:
  table = E.TableConfig(2000, dim, name="t", initializer=_INITIALIZERS[kind])
  init = row_init.RowInitializer.for_table(table)
  assert init is not None and init.distribution == kind
  return init


def test_ndtri_and_log_are_accurate():
  z = exact_math.ndtri(tf.constant(_P)).numpy()
  np.testing.assert_allclose(
    z, tf.math.ndtri(_P).numpy(), rtol=1e-14, atol=1e-14
  )
  x = np.geomspace(1e-30, 1.0, 20_001)
  np.testing.assert_allclose(exact_math.log(x).numpy(), np.log(x), rtol=1e-15)


def test_ndtri_and_log_equal_their_numpy_twin_bit_for_bit():
  np.testing.assert_array_equal(
    exact_math.ndtri(tf.constant(_P)).numpy(), reference.ndtri(_P)
  )
  x = np.geomspace(1e-30, 1.0, 20_001)
  np.testing.assert_array_equal(exact_math.log(x).numpy(), reference.log(x))


@pytest.mark.parametrize("kind", sorted(_INITIALIZERS))
def test_rows_do_not_depend_on_rows_per_call(kind):
  """Issue 52: `tf.math.ndtri` gave 21-564 of these values 1 ulp apart."""
  init = _init(kind)
  whole = init.rows(tf.range(1000, dtype=tf.int64)).numpy()
  np.testing.assert_array_equal(whole, reference.rows(init, np.arange(1000)))
  for per_call in (1, 7, 16, 17, 1000):
    count = 100 if per_call == 1 else 1000  # 100 calls of one row
    parts = [
      init.rows(tf.range(i, min(count, i + per_call), dtype=tf.int64)).numpy()
      for i in range(0, count, per_call)
    ]
    np.testing.assert_array_equal(
      np.concatenate(parts), whole[:count], f"{per_call} rows per call"
    )


_CHILD = """
import json, os, sys
import numpy as np
import recsys, tensorflow as tf
from backends.storage import row_init
from tests.backends import exact_math_reference as reference
from numpy._core._multiarray_umath import __cpu_features__
E = tf.tpu.experimental.embedding
table = E.TableConfig(
  500, 13, name="t", initializer=tf.keras.initializers.TruncatedNormal(0.1, 0.4,
  seed=11)
)
init = row_init.RowInitializer.for_table(table)
ids = np.arange(500)
print(json.dumps({
  "tf": init.rows(ids).numpy().tolist(),
  "numpy": reference.rows(init, ids).tolist(),
  "dispatch": [k for k in ("X86_V3", "X86_V4") if __cpu_features__.get(k)],
}))
"""


def test_rows_are_the_same_with_a_narrower_instruction_set():
  """A child with NumPy's AVX2/AVX-512 loops off and oneDNN flipped."""
  env = dict(
    os.environ,
    NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    TF_ENABLE_ONEDNN_OPTS="1"
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0"
    else "0",
    TF_CPP_MIN_LOG_LEVEL="3",
  )
  done = subprocess.run(
    [sys.executable, "-c", _CHILD],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  child = json.loads(done.stdout.strip().splitlines()[-1])
  assert child["dispatch"] == [], "NPY_DISABLE_CPU_FEATURES had no effect"
  here = _init("truncated_normal")
  want = here.rows(tf.range(500, dtype=tf.int64)).numpy()
  np.testing.assert_array_equal(np.float32(child["numpy"]), want)
  np.testing.assert_array_equal(np.float32(child["tf"]), want)
