"""Training a one-feature ("f") backend on 1 or more replicas, each replica
its slice of every batch: the loop the narrow-table tests share."""

import tensorflow as tf

from tests.conftest import mirrored_strategy


def strategy_for(replicas: int) -> tf.distribute.Strategy:
  """`replicas` mirrored CPUs, or the default strategy for one."""
  if replicas > 1:
    return mirrored_strategy(replicas)
  return tf.distribute.get_strategy()


def train_split(emb, strategy, batches, replicas: int, jit_compile=None):
  """One step of `emb` per `(ids, cotangents)` batch; replica r takes rows
  r, r + replicas, ... of each."""

  @tf.function(jit_compile=jit_compile)
  def step(ids, c):
    def replica(ids, c):
      emb({"f": ids}, training=True)
      emb.apply_gradients({"f": c})

    strategy.run(replica, (ids, c))

  for ids, c in batches:
    dist = strategy.experimental_distribute_values_from_function(
      lambda ctx, ids=ids, c=c: (
        tf.constant(ids[ctx.replica_id_in_sync_group :: replicas]),
        tf.constant(c[ctx.replica_id_in_sync_group :: replicas]),
      )
    )
    step(*dist)
