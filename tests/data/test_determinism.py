"""Hashed Criteo ids and synthetic examples are the same in another process."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import CriteoTSV, SyntheticCTR
from tests.data.test_criteo import make_rows, write

CODE = """
import recsys, numpy as np, tensorflow as tf
from recsys.data import CriteoTSV, SyntheticCTR
f, _ = next(iter(CriteoTSV(train_files={path!r}, vocab_sizes=1000003).dataset(5, repeat=False)))
print(",".join(str(int(x)) for n in sorted(f["categorical"]) for x in f["categorical"][n]))
f, l = SyntheticCTR(seed=7, oracle_examples=4096).examples(tf.range(64, dtype=tf.int64))
print(",".join(str(x) for x in np.concatenate([f["categorical"]["C8"].flat_values.numpy(),
                                               l.numpy().astype(np.int64)])))
"""


def digests(path):
  f, _ = next(
    iter(
      CriteoTSV(train_files=path, vocab_sizes=1000003).dataset(5, repeat=False)
    )
  )
  criteo = ",".join(
    str(int(x)) for n in sorted(f["categorical"]) for x in f["categorical"][n]
  )
  f, l = SyntheticCTR(seed=7, oracle_examples=4096).examples(
    tf.range(64, dtype=tf.int64)
  )
  synthetic = ",".join(
    str(x)
    for x in np.concatenate(
      [f["categorical"]["C8"].flat_values.numpy(), l.numpy().astype(np.int64)]
    )
  )
  return [criteo, synthetic]


def test_same_ids_and_examples_in_a_fresh_process(tmp_path):
  path = write(tmp_path / "train.txt", make_rows(5))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="123")
  out = (
    subprocess.run(
      [sys.executable, "-c", CODE.format(path=path)],
      capture_output=True,
      text=True,
      env=env,
      check=True,
    )
    .stdout.strip()
    .splitlines()[-2:]
  )
  assert out == digests(path)
