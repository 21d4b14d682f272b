"""Runs the parameter_servers backend on an in-process cluster (2 workers, 2
ps).

Usage: python -m tests.distributed.sharded_run OUT_DIR [TENSORCORE_CKPT]

This process starts the servers and is the coordinator. It builds
`sharded_case.feature_config()` with the `parameter_servers` backend, sets the
tables to `sharded_case.table_values()`, and for each batch of `sharded_case`
schedules one training step (lookup, loss = sum(acts * cot),
apply_gradients) on a worker. It writes to OUT_DIR/result.npz the
activations of each step, the final tables and slots, each shard's rows and
device; saves OUT_DIR/ckpt-1 with `tf.train.Checkpoint(embedding=...)`; and,
given TENSORCORE_CKPT, restores that into a fresh sharded backend before its
build (restore on create) and records those tables too. The test compares
everything with references in its own process.
"""

import json
import sys

from tests.distributed import cluster as cluster_lib

SPEC, SERVERS = cluster_lib.in_process_cluster(workers=2, ps=2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
from backends import conformance  # noqa: E402
from backends.parameter_servers import backend as ps_backend  # noqa: E402
from tests.distributed import sharded_case as case  # noqa: E402


def main(out_dir: str, restore_from: str = "") -> None:
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(SPEC), rpc_layer="grpc"
  )
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=ps_backend.TablePartitioner(2)
  )
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  emb = backends.create(case.feature_config(), None, strategy, backend="auto")
  with strategy.scope():
    emb.build()
  for table, var in emb.embedding_tables.items():
    var.assign(case.table_values()[table.name])

  out = {"backend": emb.name}

  def make_step(raw):
    @tf.function
    def train_step():
      def replica_fn():
        # The step the test takes on tensorcore: loss = sum(acts * cot).
        return conformance.linear_loss_step(emb, *case.tensors(raw))

      return strategy.run(replica_fn)

    return train_step

  for step, raw in enumerate(case.raw_batches()):
    result = coordinator.schedule(make_step(raw))
    coordinator.join()
    for name, value in result.fetch().items():
      out[f"acts{step}/{name}"] = value

  for table, var in emb.embedding_tables.items():
    out[f"table/{table.name}"] = tf.convert_to_tensor(var).numpy()
    for i, shard in enumerate(ps_backend.shards_of(var)):
      out[f"shard/{table.name}/{i}"] = shard.numpy()
  for name, slots in emb.slot_variables().items():
    for slot, var in slots.items():
      out[f"slot/{name}/{slot}"] = tf.convert_to_tensor(var).numpy()
      for i, shard in enumerate(ps_backend.shards_of(var)):
        out[f"slotshard/{name}/{slot}/{i}"] = shard.numpy()
  devices = {
    "tables": emb.shard_devices(),
    "slots": {
      name: {
        slot: [s.device for s in ps_backend.shards_of(v)]
        for slot, v in slots.items()
      }
      for name, slots in emb.slot_variables().items()
    },
  }
  tf.train.Checkpoint(embedding=emb).save(f"{out_dir}/ckpt")

  if restore_from:
    fresh = backends.create(
      case.feature_config(), None, strategy, backend="parameter_servers"
    )
    status = tf.train.Checkpoint(embedding=fresh).restore(restore_from)
    with strategy.scope():
      fresh.build()  # restore on create: each shard reads its slice
    status.assert_existing_objects_matched()
    for table, var in fresh.embedding_tables.items():
      out[f"restored/{table.name}"] = tf.convert_to_tensor(var).numpy()
    for name, slots in fresh.slot_variables().items():
      for slot, var in slots.items():
        out[f"restored/{name}/{slot}"] = tf.convert_to_tensor(var).numpy()
    devices["restored"] = fresh.shard_devices()

  np.savez(
    f"{out_dir}/result.npz", **{k: v for k, v in out.items() if k != "backend"}
  )
  with open(f"{out_dir}/devices.json", "w", encoding="utf-8") as f:
    json.dump({"backend": out["backend"], **devices}, f)
  print("SHARDED_RUN_OK", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
