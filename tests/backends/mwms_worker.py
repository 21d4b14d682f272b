"""One worker of the 2-process MultiWorkerMirroredStrategy test (run as a script).

Usage: python mwms_worker.py OUT.npz [--replicas 2]

With TF_CONFIG (set by the test) it is one worker of the 2-process cluster and
trains on its half of each global batch. Without it the process trains alone:
on the whole batch with one replica, or with `--replicas 2` under a
MirroredStrategy over 2 logical CPUs, each replica on its half (the same
global batch, split as the 2 workers split it). The test runs the two
references in its own process (`main(..., strategy=...)`): only the workers
need processes of their own. Two tables train side by side: "t" takes the
ids as rows; "d" takes the same ids made raw through a dynamic vocabulary
smaller than the ids it sees (admission, LRU eviction, resets), mapped in
their own `strategy.run` before each step.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import backends
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends.layout import TableLayout
from backends.vocabulary import DynamicVocabulary

E = tf.tpu.experimental.embedding
GLOBAL_BATCH, DIM, STEPS = 8, 7, 3


def batches():
  rng = np.random.default_rng(5)
  for _ in range(STEPS):
    rows = [
      list(rng.integers(0, 23, rng.integers(1, 5))) for _ in range(GLOBAL_BATCH)
    ]
    cot = rng.normal(size=(GLOBAL_BATCH, DIM)).astype(np.float32)
    yield rows, cot


def main(
  out_path: str,
  local_replicas: int = 1,
  strategy: tf.distribute.Strategy | None = None,
) -> None:
  """Trains and saves the table and its accumulators to `out_path`.

  `strategy`: a MirroredStrategy of `local_replicas` replicas to use instead
  of building one (the caller's process already set up its devices).
  """
  multi = "TF_CONFIG" in os.environ
  if multi:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  elif strategy is not None:
    assert strategy.num_replicas_in_sync == local_replicas
  elif local_replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * local_replicas
    )
    strategy = tf.distribute.MirroredStrategy(
      [d.name for d in tf.config.list_logical_devices("CPU")]
    )
  else:
    strategy = tf.distribute.get_strategy()
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if multi else 0
  workers = strategy.num_replicas_in_sync if multi else 1

  # Seeded: an unseeded table's key takes TF's global seed, which a test
  # run earlier in the references' process may have set.
  def init(seed):
    return tf.keras.initializers.TruncatedNormal(stddev=DIM**-0.5, seed=seed)

  table = E.TableConfig(23, DIM, init(1), combiner="mean", name="t")
  # The same bags' ids made raw (a bijection), into 9 rows: admissions,
  # LRU evictions and resets on every worker.
  dynamic = E.TableConfig(9, DIM, init(2), combiner="mean", name="d")
  with strategy.scope():
    emb = backends.create(
      {"f": E.FeatureConfig(table), "g": E.FeatureConfig(dynamic)},
      E.Adagrad(0.1),
      strategy,
      backend="tensorcore",
      layouts={"d": TableLayout(vocabulary=DynamicVocabulary(eviction="lru"))},
    )
    emb.build()
    for config in (table, dynamic):
      rows = config.vocabulary_size
      emb.embedding_tables[config].assign(
        tf.reshape(tf.range(rows * DIM, dtype=tf.float32) / 100.0, [rows, DIM])
      )

  def mapped(ids):
    raw = {"f": ids, "g": ids * 1_000_003 - 2**40}
    return emb.map_ids(raw, training=True)

  @tf.function
  def step(ids, cot):
    # The raw ids made rows first, in their own strategy.run.
    features = strategy.run(mapped, args=(ids,))

    def replica_step(features, cot):
      with tf.GradientTape() as tape:
        acts = emb.lookup(features, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum((acts["f"] + 2 * acts["g"]) * cot)
      emb.apply_gradients(tape.gradient(loss, acts))

    strategy.run(replica_step, args=(features, cot))

  per = GLOBAL_BATCH // workers
  for rows, cot in batches():
    if local_replicas > 1 and not multi:
      half = GLOBAL_BATCH // local_replicas

      def part(ctx, rows=rows, cot=cot, half=half):
        mine = slice(
          ctx.replica_id_in_sync_group * half,
          (ctx.replica_id_in_sync_group + 1) * half,
        )
        return tf.ragged.constant(rows[mine], dtype=tf.int64), tf.constant(
          cot[mine]
        )

      ids = strategy.experimental_distribute_values_from_function(
        lambda ctx: part(ctx)[0]
      )
      cots = strategy.experimental_distribute_values_from_function(
        lambda ctx: part(ctx)[1]
      )
      step(ids, cots)
      continue
    mine = slice(worker * per, (worker + 1) * per)
    step(tf.ragged.constant(rows[mine], dtype=tf.int64), tf.constant(cot[mine]))
  index = emb.dynamic_tables()["d"]
  keys, rows = index.mapping()
  counters = index.counters()
  slots = emb.slot_variables()
  np.savez(
    out_path,
    table=emb.embedding_tables[table].numpy(),
    acc=slots["t"]["accumulators"].numpy(),
    dtable=emb.embedding_tables[dynamic].numpy(),
    dacc=slots["d"]["accumulators"].numpy(),
    keys=keys.numpy(),
    rows=rows.numpy(),
    counters=np.array([int(counters[k]) for k in sorted(counters)]),
  )


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[3]) if sys.argv[2:3] == ["--replicas"] else 1)
