"""Drifting ids for synthetic streams: a window of ids that slides, raw ids.

A drifting feature of vocabulary size V draws the ids of the example at
stream position t from a WINDOW of V consecutive "window ids",
`[s, s + V)` with `s = floor(t / every)`: every `every` positions the
window moves by one, so one id appears (`s + V`) and one stops (`s`).

The window holds exactly one id of each residue class mod V, which is how
popularity stays put while ids come and go: a draw picks a residue
`rho in [0, V)` Zipf-skewed (as a feature without drift picks its id), and
the id is the window's id of that residue, `s + ((rho - s) mod V)`. An id
therefore keeps one popularity rank for its whole life of `V * every`
positions, and the id that replaces it takes that rank over (a new id can
be the most popular one). At `s = 0` the window ids are the residues, the
ids a feature without drift delivers.

Window ids are never delivered: a drifting feature delivers RAW ids,
`raw_id(key, w)`, a bijective 64-bit mix (splitmix64's finaliser) of the
window id plus a per-feature key. Raw ids are any int64 (negative ones
too), distinct for distinct window ids of a feature, and say nothing about
the window: a model can only use them through a dynamic-vocabulary table or
by hashing (`FeatureSpec.raw_ids`).

Example:
  >>> window_ids(residue=tf.constant([3, 0]), start=tf.constant([5, 5]),
  ...            size=7)   # the window [5, 12): residue 3 -> 10, 0 -> 7
  <tf.Tensor: [10, 7]>
"""

import numpy as np
import tensorflow as tf

_M64 = (1 << 64) - 1
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def window_ids(
  residue: tf.Tensor, start: tf.Tensor, size: np.ndarray | int
) -> tf.Tensor:
  """The id of each residue in the window `[start, start + size)`.

  Args:
    residue: int64 draws in `[0, size)`, any shape.
    start: int64 window starts, broadcastable against `residue`.
    size: the window size(s) V, broadcastable against `residue`.

  Returns:
    int64 `start + ((residue - start) mod size)`, shaped like the broadcast.
  """
  size = tf.constant(np.asarray(size, np.int64))
  return start + tf.math.floormod(residue - start, size)


def raw_id(keys: np.ndarray | int, window: tf.Tensor) -> tf.Tensor:
  """The raw int64 ids of window ids: `mix64(window + key)`, bijective.

  `mix64` is splitmix64's finaliser (xor-shift, odd multiply, twice, and a
  last xor-shift: each step invertible on 64 bits), so distinct window ids
  of one key never share a raw id. `raw_id_py` is the same in Python.

  Args:
    keys: uint64-valued keys (one per column, e.g. `[M]`), broadcastable
      against `window`.
    window: int64 window ids, e.g. `[N, M]`.

  Returns:
    int64 raw ids shaped like `window` (the 64 bits read as signed).
  """
  keys = tf.constant(np.asarray(keys, np.uint64))
  z = tf.bitcast(window, tf.uint64) + keys
  z = _xorshift(z, 30) * tf.constant(_MIX1, tf.uint64)
  z = _xorshift(z, 27) * tf.constant(_MIX2, tf.uint64)
  return tf.bitcast(_xorshift(z, 31), tf.int64)


def _xorshift(z: tf.Tensor, bits: int) -> tf.Tensor:
  return tf.bitwise.bitwise_xor(
    z, tf.bitwise.right_shift(z, tf.constant(bits, tf.uint64))
  )


def raw_id_py(key: int, window: int) -> int:
  """`raw_id` of one window id, in Python (the reference the tests use)."""
  z = (window + key) & _M64
  z = ((z ^ (z >> 30)) * _MIX1) & _M64
  z = ((z ^ (z >> 27)) * _MIX2) & _M64
  z ^= z >> 31
  return z - (1 << 64) if z >> 63 else z


__all__ = ["raw_id", "raw_id_py", "window_ids"]
