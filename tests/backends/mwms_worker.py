"""One worker of the 2-process MultiWorkerMirroredStrategy test (run as a script).

Usage: python mwms_worker.py OUT.npz   (TF_CONFIG set by the test; without it,
the process trains alone on the whole batch: the reference).
"""

import json
import os
import sys

import numpy as np

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
import tensorflow as tf

import backends

E = tf.tpu.experimental.embedding
GLOBAL_BATCH, DIM, STEPS = 8, 7, 3


def batches():
  rng = np.random.default_rng(5)
  for _ in range(STEPS):
    rows = [list(rng.integers(0, 23, rng.integers(1, 5))) for _ in range(GLOBAL_BATCH)]
    cot = rng.normal(size=(GLOBAL_BATCH, DIM)).astype(np.float32)
    yield rows, cot


def main(out_path: str) -> None:
  multi = "TF_CONFIG" in os.environ
  strategy = (tf.distribute.MultiWorkerMirroredStrategy() if multi
              else tf.distribute.get_strategy())
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if multi else 0
  workers = strategy.num_replicas_in_sync if multi else 1
  table = E.TableConfig(23, DIM, combiner="mean", name="t")
  with strategy.scope():
    emb = backends.create({"f": E.FeatureConfig(table)}, E.Adagrad(0.1), strategy)
    emb.build()
    var = emb.embedding_tables[table]
    var.assign(tf.reshape(tf.range(23 * DIM, dtype=tf.float32) / 100.0, [23, DIM]))

  @tf.function
  def step(ids, cot):
    def replica_step(ids, cot):
      with tf.GradientTape() as tape:
        acts = emb.lookup({"f": ids}, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum(acts["f"] * cot)
      emb.apply_gradients(tape.gradient(loss, acts))
    strategy.run(replica_step, args=(ids, cot))

  per = GLOBAL_BATCH // workers
  for rows, cot in batches():
    mine = slice(worker * per, (worker + 1) * per)
    step(tf.ragged.constant(rows[mine], dtype=tf.int64), tf.constant(cot[mine]))
  np.savez(out_path, table=var.numpy(),
           acc=emb.slot_variables()["t"]["accumulators"].numpy())


if __name__ == "__main__":
  main(sys.argv[1])
