"""One worker of the 2-process MultiWorkerMirroredStrategy test (run as a script).

Usage: python mwms_worker.py OUT.npz [--replicas 2] [--dynamic]

With TF_CONFIG (set by the test) it is one worker of the 2-process cluster and
trains on its half of each global batch. Without it the process trains alone:
on the whole batch with one replica, or with `--replicas 2` under a
MirroredStrategy over 2 logical CPUs, each replica on its half (the same
global batch, split as the 2 workers split it). The test runs the two
references in its own process (`main(..., strategy=...)`): only the workers
need processes of their own. `--dynamic`: the table takes raw ids through a
dynamic vocabulary smaller than the ids it sees (admission, LRU eviction,
resets), mapped in its own `strategy.run` before each step.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import backends
import recsys  # noqa: F401  (Keras 2 before TensorFlow)

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
  dynamic: bool = False,
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
  table = E.TableConfig(
    23 if not dynamic else 9, DIM, combiner="mean", name="t"
  )
  layouts = None
  if dynamic:
    from backends.layout import TableLayout
    from backends.vocabulary import DynamicVocabulary

    layouts = TableLayout(vocabulary=DynamicVocabulary(eviction="lru"))
  with strategy.scope():
    emb = backends.create(
      {"f": E.FeatureConfig(table)},
      E.Adagrad(0.1),
      strategy,
      backend="tensorcore",
      layouts=layouts,
    )
    emb.build()
    var = emb.embedding_tables[table]
    rows = table.vocabulary_size
    var.assign(
      tf.reshape(tf.range(rows * DIM, dtype=tf.float32) / 100.0, [rows, DIM])
    )

  @tf.function
  def step(ids, cot):
    if dynamic:  # raw ids (a bijection of the small ones) made rows first
      ids = strategy.run(
        lambda ids: emb.map_ids({"f": ids * 1_000_003 - 2**40}, True)["f"],
        args=(ids,),
      )

    def replica_step(ids, cot):
      with tf.GradientTape() as tape:
        acts = emb.lookup({"f": ids}, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum(acts["f"] * cot)
      emb.apply_gradients(tape.gradient(loss, acts))

    strategy.run(replica_step, args=(ids, cot))

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
  extra = {}
  if dynamic:
    index = emb.dynamic_tables()["t"]
    keys, rows = index.mapping()
    counters = index.counters()
    extra = dict(
      keys=keys.numpy(),
      rows=rows.numpy(),
      counters=np.array([int(counters[k]) for k in sorted(counters)]),
    )
  np.savez(
    out_path,
    table=var.numpy(),
    acc=emb.slot_variables()["t"]["accumulators"].numpy(),
    **extra,
  )


if __name__ == "__main__":
  main(
    sys.argv[1],
    int(sys.argv[3]) if sys.argv[2:3] == ["--replicas"] else 1,
    dynamic="--dynamic" in sys.argv,
  )
