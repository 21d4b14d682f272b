"""One worker of the 2-process MultiWorkerMirroredStrategy test (run as a script).

Usage: python mwms_worker.py OUT.npz [--replicas 2]

With TF_CONFIG (set by the test) it is one worker of the 2-process cluster and
trains on its half of each global batch. Without it the process trains alone:
on the whole batch with one replica, or with `--replicas 2` under a
MirroredStrategy over 2 logical CPUs, each replica on its half (the same
global batch, split as the 2 workers split it). The test runs the two
references in its own process (`main(..., strategy=...)`): only the workers
need processes of their own. Three tables train side by side: "t" takes
the ids as rows; "d" takes the same ids made raw through a dynamic
vocabulary smaller than the ids it sees (admission, LRU eviction, resets),
mapped in their own `strategy.run` before each step; "s" takes them made
raw otherwise through an index in 3 shards, which the 2 workers hold apart
(shards 0 and 2 on worker 0, 1 on worker 1). At the end every process
reads the rows of every id through "s" (an evaluation's read: with shards
apart the workers read together) and saves a checkpoint the project's way
(each worker its shards, as slices: `checkpoint_into`), which
`restored_state` reads back into one process.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import backends
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends.layout import TableLayout
from backends.storage import row_sharded_checkpoint
from backends.vocabulary import DynamicVocabulary

E = tf.tpu.experimental.embedding
GLOBAL_BATCH, DIM, STEPS = 8, 7, 3
IDS = 23  # the ids the batches draw from


def sharded_raw(ids):
  """Table "s"'s raw ids for ids (another bijection than "d"'s)."""
  return ids * 7919 + 2**41


def build(strategy):
  """The backend of the three tables, its values set (made in
  `strategy`'s scope)."""

  # Seeded: an unseeded table's key takes TF's global seed, which a test
  # run earlier in the references' process may have set.
  def init(seed):
    return tf.keras.initializers.TruncatedNormal(stddev=DIM**-0.5, seed=seed)

  table = E.TableConfig(IDS, DIM, init(1), combiner="mean", name="t")
  # The same bags' ids made raw (a bijection), into 9 rows: admissions,
  # LRU evictions and resets on every worker.
  dynamic = E.TableConfig(9, DIM, init(2), combiner="mean", name="d")
  sharded = E.TableConfig(11, DIM, init(3), combiner="mean", name="s")
  with strategy.scope():
    emb = backends.create(
      {
        "f": E.FeatureConfig(table),
        "g": E.FeatureConfig(dynamic),
        "h": E.FeatureConfig(sharded),
      },
      E.Adagrad(0.1),
      strategy,
      backend="tensorcore",
      layouts={
        "d": TableLayout(vocabulary=DynamicVocabulary(eviction="lru")),
        "s": TableLayout(
          vocabulary=DynamicVocabulary(eviction="lru", shards=3)
        ),
      },
    )
    emb.build()
    for config in (table, dynamic, sharded):
      rows = config.vocabulary_size
      emb.embedding_tables[config].assign(
        tf.reshape(tf.range(rows * DIM, dtype=tf.float32) / 100.0, [rows, DIM])
      )
  return emb, (table, dynamic, sharded)


def checkpoint_into(emb, strategy, chief: str, own: str) -> str:
  """Saves `emb` as the Trainer does (each worker its shards and rows
  beside the chief's checkpoint at `chief`; `own`: this process's own
  prefix, the chief's for the chief); returns the chief's path."""
  ckpt = tf.train.Checkpoint(embedding=emb)
  row_sharded_checkpoint.save(
    ckpt,
    strategy,
    lambda options: ckpt.write(own, options=options),
    chief=own == chief,
    chief_prefix=lambda path: chief,
  )
  return chief


def restored_state(path: str) -> dict[str, np.ndarray]:
  """The checkpoint at `path` restored into this process (default
  strategy, every shard here): table "s", its slots and its index."""
  emb, (_, _, sharded) = build(tf.distribute.get_strategy())
  ckpt = tf.train.Checkpoint(embedding=emb)
  row_sharded_checkpoint.restore(ckpt, path, ckpt.read)
  return _index_of(emb, sharded, "s")


def _index_of(emb, config, name) -> dict[str, np.ndarray]:
  """A table, its accumulators and its index's mapping and counters."""
  index = emb.dynamic_tables()[name]
  keys, rows = index.mapping()
  counters = index.counters()
  return {
    f"{name}table": emb.embedding_tables[config].numpy(),
    f"{name}acc": emb.slot_variables()[name]["accumulators"].numpy(),
    f"{name}keys": keys.numpy(),
    f"{name}rows": rows.numpy(),
    f"{name}counters": np.array([int(counters[k]) for k in sorted(counters)]),
  }


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
  emb, (table, dynamic, sharded) = build(strategy)

  def mapped(ids):
    raw = {"f": ids, "g": ids * 1_000_003 - 2**40, "h": sharded_raw(ids)}
    return emb.map_ids(raw, training=True)

  @tf.function
  def step(ids, cot):
    # The raw ids made rows first, in their own strategy.run.
    features = strategy.run(mapped, args=(ids,))

    def replica_step(features, cot):
      with tf.GradientTape() as tape:
        acts = emb.lookup(features, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum((acts["f"] + 2 * acts["g"] + 3 * acts["h"]) * cot)
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
  # Every id's row in "s", read as an evaluation reads (every worker).
  every = tf.constant(np.arange(IDS), tf.int64)
  looked = emb.map_ids(
    {"f": every, "g": every, "h": sharded_raw(every)}, training=False
  )["h"]
  # The cluster's workers share one checkpoint (the chief's path); each
  # process alone writes its own.
  folder = Path(out_path).parent
  name = "cluster" if multi else Path(out_path).stem
  chief = str(folder / f"{name}_checkpoint" / "ckpt")
  own = chief if worker == 0 else str(folder / f"own{worker}" / "ckpt")
  checkpoint_into(emb, strategy, chief, own)
  np.savez(
    out_path,
    table=emb.embedding_tables[table].numpy(),
    acc=slots["t"]["accumulators"].numpy(),
    dtable=emb.embedding_tables[dynamic].numpy(),
    dacc=slots["d"]["accumulators"].numpy(),
    keys=keys.numpy(),
    rows=rows.numpy(),
    counters=np.array([int(counters[k]) for k in sorted(counters)]),
    slooked=looked.numpy(),
    held=np.array(emb.dynamic_tables()["s"].held),
    **_index_of(emb, sharded, "s"),
  )


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[3]) if sys.argv[2:3] == ["--replicas"] else 1)
