"""One dynamic-vocabulary table, its raw-id batches and its training step,
shared by `dynamic_ps_run.py` (parameter servers, a subprocess) and the
test's one-process reference (tensorcore, default strategy).

Raw 64-bit ids from a window that moves 3 ids a step over 30, into 24
rows: the table fills in the first steps, then evicts (LRU) and resets
the rows it reuses, every step.
"""

import numpy as np
import tensorflow as tf

import backends
from backends.layout import TableLayout
from backends.vocabulary import DynamicVocabulary

E = tf.tpu.experimental.embedding
TABLE = "items"
CAPACITY = 24
DIM = 4
BATCH = 16
STEPS = 12
WINDOW, MOVE = 30, 3


def _raw(ids: np.ndarray) -> np.ndarray:
  return (ids * 7919 + 2**41).astype(np.int64)


def backend(strategy, name: str, shards: int = 1):
  """`name` ("parameter_servers" or "tensorcore") with the dynamic table
  (its index in `shards` shards)."""
  table = E.TableConfig(
    CAPACITY,
    DIM,
    name=TABLE,
    initializer=tf.random_uniform_initializer(-0.1, 0.1, seed=3),
  )
  return backends.create(
    {"item": E.FeatureConfig(table)},
    E.Adagrad(0.1),
    strategy,
    backend=name,
    layouts={
      TABLE: TableLayout(
        vocabulary=DynamicVocabulary(eviction="lru", shards=shards)
      )
    },
  )


def batches():
  """`STEPS` batches of (raw ids int64 [BATCH], labels float32 [BATCH])."""
  rng = np.random.default_rng(5)
  for s in range(STEPS):
    ids = rng.integers(MOVE * s, MOVE * s + WINDOW, BATCH)
    yield _raw(ids), rng.random(BATCH).astype(np.float32)


def every_id() -> np.ndarray:
  """Every raw id the batches can hold."""
  return _raw(np.arange(MOVE * STEPS + WINDOW))


def replica_step(emb, features, labels) -> None:
  """One step of a squared loss on the summed activation (mapped ids)."""
  with tf.GradientTape() as tape:
    acts = emb.lookup(features, training=True)
    tape.watch(acts)
    loss = tf.reduce_mean((tf.reduce_sum(acts["item"], 1) - labels) ** 2)
  emb.apply_gradients(tape.gradient(loss, acts))


def state(emb) -> dict[str, np.ndarray]:
  """The table, its slots and its index (rows' ids, occupancy, counters,
  the hash table's id -> row pairs sorted by id)."""
  index = emb.dynamic_tables()[TABLE]
  out = {
    "table": tf.convert_to_tensor(
      next(iter(emb.embedding_tables.values()))
    ).numpy(),
    "keys": index.keys.numpy(),
    "occupied": index.occupied.numpy(),
    "last_seen": index.last_seen.numpy(),
  }
  for slot, var in emb.slot_variables()[TABLE].items():
    out[f"slot/{slot}"] = tf.convert_to_tensor(var).numpy()
  for name, value in index.counters().items():
    out[f"counter/{name}"] = np.asarray(value.numpy())
  pairs = []  # each shard's hash table, its rows the table's
  shards = getattr(index, "shards", [index])
  held = getattr(index, "held", (0,))
  for shard, first in zip(
    shards, [getattr(index, "bounds", (0,))[s] for s in held]
  ):
    ids, rows = (t.numpy() for t in shard.table.export())
    kept = rows >= 0
    pairs.append(np.stack([ids[kept], rows[kept] + first], axis=1))
  pairs = np.concatenate(pairs)
  out["pairs"] = pairs[np.argsort(pairs[:, 0])]
  return out
