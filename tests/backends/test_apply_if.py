"""`apply_gradients(..., apply_if=...)`: a step left out, on every storage.

`recsys.layers.Embedding` skips the tables' update when Keras's loss scaler
skips a step. The replicas still exchange the step's rows (a
`MirroredStrategy` cannot run collectives inside a `tf.cond`), so the
condition guards only the writes. References: the tables and slots before
the step (False, NaN gradients too) and the same step applied without
`apply_if` (True).
"""

import numpy as np
import pytest
import tensorflow as tf

from backends.layout import TableLayout
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
BATCH = 8


def config():
  def table(name, vocab, optimizer):
    return E.TableConfig(
      vocab,
      3,
      name=name,
      initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=len(name)),
      optimizer=optimizer,
    )

  return {
    "u": E.FeatureConfig(table("users", 11, E.Adam(0.1))),
    "m": E.FeatureConfig(table("movies", 13, E.Adagrad(0.1))),
  }


def state(backend):
  out = {t.name: v.numpy() for t, v in backend.embedding_tables.items()}
  for table, slots in backend.slot_variables().items():
    out.update({f"{table}.{k}": v.numpy() for k, v in slots.items()})
  return out


def run_step(backend, strategy, apply_if, nan=False):
  rng = np.random.default_rng(0)
  ids = {"u": rng.integers(0, 11, BATCH), "m": rng.integers(0, 13, BATCH)}
  dist = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensors(ids).unbatch().batch(BATCH)
  )

  @tf.function
  def step(batch):
    def replica(batch):
      with tf.GradientTape() as tape:
        acts = backend.lookup(batch, training=True)
        tape.watch(acts)
        loss = sum(tf.reduce_sum(a * a) for a in acts.values())
      grads = tape.gradient(loss, acts)
      if nan:
        grads = {k: g * float("nan") for k, g in grads.items()}
      if apply_if is None:
        backend.apply_gradients(grads)
      else:
        backend.apply_gradients(grads, apply_if=tf.constant(apply_if))

    strategy.run(replica, args=(batch,))

  step(next(iter(dist)))


@pytest.mark.parametrize("placement", ["replicated", "row_sharded"])
@pytest.mark.parametrize(
  "replicas", [1, pytest.param(2, marks=pytest.mark.slow)]
)
def test_false_leaves_tables_and_slots_and_true_applies(replicas, placement):
  strategy = (
    tf.distribute.get_strategy()
    if replicas == 1
    else mirrored_strategy(replicas)
  )

  def backend():
    made = TensorCoreEmbedding(
      config(), strategy=strategy, layouts=TableLayout(placement)
    )
    with strategy.scope():
      made.build()
    return made

  skipped, applied, reference = backend(), backend(), backend()
  before = state(skipped)
  run_step(skipped, strategy, False, nan=True)
  for name, value in state(skipped).items():
    np.testing.assert_array_equal(value, before[name], err_msg=name)
  run_step(applied, strategy, True)
  run_step(reference, strategy, None)
  want = state(reference)
  assert any(not np.array_equal(want[k], before[k]) for k in want)
  # Exact: the same ops on the same rows; the condition guards the writes.
  for name, value in state(applied).items():
    np.testing.assert_array_equal(value, want[name], err_msg=name)
