"""`fit` with recsys.layers.Embedding in one process of a cluster (run as a
script).

Usage: python -m tests.layers.keras_fit_run MODE OUT.npz

MODE "single": the default strategy (the reference). "mwms": one worker of a
MultiWorkerMirroredStrategy (TF_CONFIG set by the test). "ps": this process
starts 1 worker and 2 parameter servers in-process and is the coordinator of
a ParameterServerStrategy (tables split by the `parameter_servers` backend);
Keras `fit` schedules the steps on the worker. Every mode trains the same model
from the same initial values on the same global batches and writes the
tables, slots, the dynamic table's index and dense weights to OUT.npz.

`users` is a dynamic-vocabulary table: raw 64-bit user ids, more of them
than its 23 rows, so the layer's `call` maps, admits, evicts and resets
rows (on MWMS once for the global batch, each worker holding one of its
2 shards; on the parameter servers in the index's critical section, its 2
shards one on each server).
"""

import sys

MODE = sys.argv[1] if __name__ == "__main__" else "single"
if MODE == "ps":
  from tests.distributed import cluster as cluster_lib

  SPEC, SERVERS = cluster_lib.in_process_cluster(workers=1, ps=2)

import numpy as np  # noqa: E402

import recsys  # noqa: E402,F401  (Keras 2 before TensorFlow)
from backends.vocabulary import DynamicVocabulary  # noqa: E402
from recsys import layers, planning  # noqa: E402
from recsys._keras import keras, tf  # noqa: E402

E = tf.tpu.experimental.embedding
GLOBAL_BATCH, STEPS = 8, 4
USERS = 80  # distinct raw user ids drawn from, into the table's 23 rows


def data():
  rng = np.random.default_rng(3)
  n = GLOBAL_BATCH * STEPS
  users = rng.integers(0, USERS, n) * 7919 + 2**40  # raw ids
  x = {"user": users, "movie": rng.integers(0, 29, n)}
  return x, rng.normal(size=(n, 1)).astype("float32")


def initial():
  rng = np.random.default_rng(4)
  return (
    {
      "users": rng.normal(size=(23, 7)).astype("float32"),
      "movies": rng.normal(size=(29, 11)).astype("float32"),
    },
    [rng.normal(size=(18, 1)).astype("float32"), np.zeros([1], "float32")],
  )


def build(strategy):
  with strategy.scope():
    emb = layers.Embedding(
      {
        "user": E.FeatureConfig(E.TableConfig(23, 7, name="users")),
        "movie": E.FeatureConfig(E.TableConfig(29, 11, name="movies")),
      },
      E.Adagrad(0.1),
      placement=planning.EmbeddingPlacement(
        vocabularies={"users": DynamicVocabulary(eviction="lru", shards=2)}
      ),
    )
    inputs = {
      k: keras.Input([], dtype=tf.int64, name=k) for k in ("user", "movie")
    }
    acts = emb(inputs)
    dense = keras.layers.Dense(1)
    model = keras.Model(
      inputs, dense(tf.concat([acts["user"], acts["movie"]], -1))
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  tables, dense_values = initial()
  for config, var in emb.embedding_tables.items():
    var.assign(tables[config.name])
  dense.set_weights(dense_values)
  return emb, model, dense


def main(mode: str, out: str) -> None:
  # TF's global seed enters the key of a table's starting rows, which the
  # dynamic table's reused rows are reset to: set here, the reference (run
  # inside pytest, after other tests set theirs) and the clusters agree.
  tf.random.set_seed(11)
  x, y = data()
  if mode == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  elif mode == "ps":
    from backends.parameter_servers import backend as ps_backend  # pylint: disable=g-import-not-at-top

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(SPEC), rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=ps_backend.TablePartitioner(2)
    )
  else:
    strategy = tf.distribute.get_strategy()
  emb, model, dense = build(strategy)
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  if mode == "ps":

    def dataset_fn(ctx):
      del ctx  # one worker: it reads every batch, in order
      # Built on the worker from the data, not captured from this process.
      return (
        tf.data.Dataset.from_tensor_slices(data())
        .batch(GLOBAL_BATCH, drop_remainder=True)
        .repeat()
      )

    model.fit(
      keras.utils.experimental.DatasetCreator(dataset_fn),
      epochs=1,
      steps_per_epoch=STEPS,
      verbose=0,
    )
  else:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA
    )
    model.fit(
      ds.batch(GLOBAL_BATCH).with_options(options),
      epochs=1,
      verbose=0,
      shuffle=False,
    )
  result = {}
  for config, var in emb.embedding_tables.items():
    result[config.name] = tf.convert_to_tensor(var).numpy()
  for table, slots in emb.embedding.slot_variables().items():
    for slot, var in slots.items():
      result[f"{table}.{slot}"] = tf.convert_to_tensor(var).numpy()
  for i, value in enumerate(dense.get_weights()):
    result[f"dense_{i}"] = value
  index = emb.embedding.dynamic_tables()["users"]
  # On MWMS each worker holds one of the 2 shards: its ids and rows.
  result["users.held"] = np.array(index.held)
  result["users.ids"], result["users.rows"] = (
    t.numpy() for t in index.mapping()
  )
  for name, value in index.counters().items():
    result[f"users.{name}"] = value.numpy()
  np.savez(out, **result)
  print(f"{mode}: backend {emb.backend_name}, wrote {out}")


if __name__ == "__main__":
  main(MODE, sys.argv[2])
