"""Dynamic-vocabulary tables on the parameter_servers backend, in-process
cluster (2 workers, 2 parameter servers).

Usage: python -m tests.distributed.dynamic_ps_run OUT.npz

This process starts the servers and is the coordinator. Twice it builds
`dynamic_case.feature_config()` with the `parameter_servers` backend and
the case's dynamic table, and trains on `dynamic_case.batches()`, each step
(map raw ids, lookup, loss, apply_gradients) a function scheduled on a
worker:

* "sequential": one step at a time (joined after each), which any worker
  may run: what one process computes, step by step; the index in 2
  shards, one on each server;
* "concurrent": every step scheduled at once, both workers mapping and
  updating at the same time (the index whole, shared on the first server).

It writes each run's tables, slots and index (keys, occupied, counters, the
hash table's id -> row pairs) and the rows the read-only lookup of every
id gives; the test compares the first with one process and checks the
second's invariants.
"""

import sys

from tests.distributed import cluster as cluster_lib

SPEC, SERVERS = cluster_lib.in_process_cluster(workers=2, ps=2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: E402,F401  (Keras 2 before TensorFlow's use)
from backends.parameter_servers import backend as ps_backend  # noqa: E402
from tests.distributed import dynamic_case as case  # noqa: E402


def _train(strategy, coordinator, concurrent: bool) -> dict[str, np.ndarray]:
  shards = 1 if concurrent else 2
  emb = case.backend(strategy, "parameter_servers", shards=shards)
  with strategy.scope():
    emb.build()

  @tf.function
  def step(ids, labels):
    features = emb.map_ids({"item": ids}, training=True)
    strategy.run(case.replica_step, args=(emb, features, labels))

  for ids, labels in case.batches():
    coordinator.schedule(step, args=(tf.constant(ids), tf.constant(labels)))
    if not concurrent:
      coordinator.join()
  coordinator.join()
  out = case.state(emb)
  every = tf.constant(case.every_id())
  out["looked_up"] = emb.map_ids({"item": every}, training=False)[
    "item"
  ].numpy()
  index = emb.dynamic_tables()[case.TABLE]
  out["index_devices"] = np.array(
    [s.keys.device for s in getattr(index, "shards", [index])]
  )
  return out


def main(path: str) -> None:
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(SPEC), rpc_layer="grpc"
  )
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=ps_backend.TablePartitioner(2)
  )
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  out = {}
  for name, concurrent in (("sequential", False), ("concurrent", True)):
    for key, value in _train(strategy, coordinator, concurrent).items():
      out[f"{name}/{key}"] = value
  np.savez(path, **out)
  print("DYNAMIC_PS_RUN_OK", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
