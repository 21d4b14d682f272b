"""SyntheticCTR without drift stays bit-identical to the source before drift.

The drift settings (`drift_every`) are opt-in: with them off, every example
and the planted optimum must be what they were. Four settings (the default
experiment's, a small mixed one, the same with hashed factors, and a sized
one) are hashed: training and evaluation examples (ids, bags, weights,
dense values, labels) at small and very large indices; the sums of the
true probabilities and the Bayes optimum are pinned to 1e-6 (they come
from matmuls, whose last bits oneDNN's summation order changes under
`TF_ENABLE_ONEDNN_OPTS=1`). The values were computed at cab6e2b, before
drift existed (run this file as a script to print them; three runs agreed,
one with oneDNN).
"""

import hashlib

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import SyntheticCTR

SMALL = dict(
  num_dense=3,
  vocab_sizes=(23, 11, 7),
  multi_hot_sizes=(1, 4, 2),
  weighted=(False, True, False),
  oracle_examples=1 << 12,
)

SETTINGS = {
  "default": dict(oracle_examples=1 << 12, seed=7),
  "small": dict(SMALL, seed=3, zipf_exponent=0.8),
  "small_hashed": dict(SMALL, max_factor_table_size=0),
  "sized": dict(SMALL, num_examples=53, num_eval_examples=17, ctr=0.4),
}

EXPECTED: dict[str, tuple[str, list[float]]] = {
  "default": (
    "6093249285421568aba945258faed0905c7b4d81dea87a3d8912b94964e46e8f",
    [
      55.970726013183594,
      56.38372039794922,
      0.8229112905561142,
      0.4225278180675088,
    ],
  ),
  "sized": (
    "e1d050321dac90399709fe92285674852fab8051c123f0eb73e80ab214745577",
    [
      83.69821166992188,
      83.78181457519531,
      0.8064440102818509,
      0.5172306360503547,
    ],
  ),
  "small": (
    "2ca166583086be8a5bc18dbbeb3a54ddbc0b06176326b1d3be05b8946bebc079",
    [
      44.99467468261719,
      44.622474670410156,
      0.8119466328000079,
      0.4316343748691803,
    ],
  ),
  "small_hashed": (
    "5bf56c77d5d87ab2e54292b204cbea88721a2e52ee371d734db65a747f370561",
    [
      53.891258239746094,
      54.77623748779297,
      0.813144442147416,
      0.42839528499424584,
    ],
  ),
}


def _arrays(features, labels) -> list[np.ndarray]:
  out = [labels.numpy()]
  for key in sorted(features):
    values = features[key]
    for name in sorted(values) if isinstance(values, dict) else [None]:
      value = values[name] if name is not None else values
      if isinstance(value, tf.RaggedTensor):
        out += [value.flat_values.numpy(), value.row_splits.numpy()]
      else:
        out.append(value.numpy())
  return out


def generated(setting: str) -> tuple[str, list[float]]:
  """`(sha256 of the examples, [sum of the true probabilities of the
  training and eval examples, Bayes AUC, Bayes log-loss])` of `setting`."""
  source = SyntheticCTR(**SETTINGS[setting])
  index = tf.constant(list(range(200)) + [10**6, 2**40, 2**62], tf.int64)
  arrays, floats = [], []
  for training in (True, False):
    features, labels = source.examples(index, training=training)
    arrays += _arrays(features, labels)
    floats.append(float(np.sum(source.probabilities(features).numpy())))
  floats += [source.bayes_auc, source.bayes_logloss]
  specs = [
    (s.name, s.vocabulary_size, s.multi_hot, s.max_ids, s.weighted)
    for s in source.feature_specs
  ]
  h = hashlib.sha256(repr(specs).encode())
  for a in arrays:
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest(), floats


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_examples_are_bit_identical_to_the_pinned_digests(setting):
  digest, floats = generated(setting)
  want_digest, want_floats = EXPECTED[setting]
  assert digest == want_digest
  assert floats == pytest.approx(want_floats, rel=1e-6)


if __name__ == "__main__":  # prints the values to pin
  for name in sorted(SETTINGS):
    digest, floats = generated(name)
    print(f'  "{name}": (\n    "{digest}",\n    {floats!r},\n  ),')
