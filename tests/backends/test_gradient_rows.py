"""An exchanged update sends only the rows a gradient reaches.

A feature whose activation gradient is None (looked up, not trained: iALS's
histories) shares its table with trained features. Reference: the same
steps on one replica, whose update is never cut (it covers every row
looked up, with gradient 0 where no gradient reaches): on 2 replicas,
replicated and row-sharded, uncompiled and static, the tables and slots
must equal it, for optimizers where a zero gradient keeps a row (SGD,
Adagrad: cut) and where it does not (lazy Adam decays the moments of every
row looked up: not cut). That the cut happens is read from the traced
step's collectives: fewer bytes than with an explicit zero gradient.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import gradient_rows, optimizers
from backends.layout import TableLayout
from backends.tensorcore.backend import TensorCoreEmbedding
from benchmarks import row_sharding
from tests.backends import test_compiled_path as compiled
from tests.backends import test_row_sharded as sharded
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
BATCH = 8
WIDTH = 6  # the lookup-only feature's ids per example
VOCAB = 40


def config():
  """Three tables, each read by a trained feature and a lookup-only one."""
  init = tf.keras.initializers.RandomUniform(-1, 1, seed=3)
  out = {}
  for name, optimizer in (
    ("sgd", E.SGD(0.1, clipvalue=0.5)),
    ("adagrad", E.Adagrad(0.1)),
    ("adam", E.Adam(0.01)),  # lazy: a zero gradient still moves a row
  ):
    table = E.TableConfig(
      VOCAB, 4, name=name, initializer=init, optimizer=optimizer
    )
    out[f"{name}_trained"] = E.FeatureConfig(table)
    out[f"{name}_read"] = E.FeatureConfig(table, max_sequence_length=WIDTH)
  return out


def data(steps=3, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    features = {}
    for name in ("sgd", "adagrad", "adam"):
      features[f"{name}_trained"] = rng.integers(0, VOCAB // 2, BATCH)
      # Mostly rows no trained id reads (the upper half of the table).
      features[f"{name}_read"] = rng.integers(0, VOCAB, (BATCH, WIDTH))
    yield features


def loss_of(acts, zero_gradient_for_read, frozen=()):
  """Trained features pulled to 0.3; read ones (and every feature of the
  `frozen` tables) in the loss without a gradient, or with one of 0."""
  trained = [
    k for k in acts if "trained" in k and not k.startswith(tuple(frozen))
  ]
  loss = tf.add_n([tf.reduce_sum(tf.square(acts[k] - 0.3)) for k in trained])
  others = [v for k, v in acts.items() if k not in trained]
  if zero_gradient_for_read:  # every feature gets a gradient (of 0)
    return loss + tf.add_n([0.0 * tf.reduce_sum(v) for v in others])
  return loss + tf.add_n(
    [tf.reduce_sum(tf.stop_gradient(v)) * 0.0 for v in others]
  )


def train(
  replicas, placement="replicated", static=False, zero=False, frozen=()
):
  strategy = (
    mirrored_strategy(replicas)
    if replicas > 1
    else tf.distribute.get_strategy()
  )
  with strategy.scope():
    emb = TensorCoreEmbedding(
      config(),
      E.SGD(0.1),
      strategy,
      layouts=TableLayout(placement),
      static_shapes=static,
    )
    emb.build()
  initial = compiled.table_state(emb)
  batches = [
    {k: tf.constant(v, tf.int64) for k, v in b.items()} for b in data()
  ]
  run = sharded.train(
    emb,
    strategy,
    [(b, None) for b in batches],
    lambda acts: loss_of(acts, zero, frozen),
    BATCH,
  )
  bytes_, _ = row_sharding.collective_byte_count(
    run.get_concrete_function(batches[0]).graph
  )
  return initial, compiled.table_state(emb), bytes_


_ONE: list = []


def one_replica():
  if not _ONE:
    _ONE.append(train(1)[1])
  return _ONE[0]


@pytest.mark.parametrize(
  "placement, static",
  [
    ("replicated", False),
    ("row_sharded", False),
    ("row_sharded", True),
  ],
  ids=["replicated", "row_sharded", "row_sharded-static"],
)
def test_update_cut_to_reached_rows_equals_one_replica(
  placement, static, monkeypatch
):
  cut = []
  compact = gradient_rows.compact

  def spy(step, row_grads, reached):
    cut.append(reached.bound)
    return compact(step, row_grads, reached)

  monkeypatch.setattr(gradient_rows, "compact", spy)
  _, state, cut_bytes = train(2, placement, static)
  # SGD's and Adagrad's tables cut to the trained ids' slots, each replica.
  assert cut == [BATCH // 2] * 4
  reference = one_replica()
  for key, value in reference.items():
    np.testing.assert_allclose(
      state[key], value, rtol=1e-6, atol=1e-7, err_msg=key
    )
  if placement == "row_sharded":  # (a replicated all-gather's size is lost)
    _, _, full_bytes = train(2, placement, static, zero=True)
    assert cut_bytes < full_bytes
  if placement == "row_sharded" and not static:
    # The data tells the rule's cases apart: cutting lazy Adam's update
    # too would leave rows read (not trained) in a step, with moments
    # from an earlier one, where one replica's update moves them.
    monkeypatch.setattr(
      optimizers, "zero_gradient_is_identity", lambda optimizer: True
    )
    _, wrongly_cut, _ = train(2, placement, static)
    assert not np.allclose(
      wrongly_cut["adam/parameters"], reference["adam/parameters"]
    )


def test_a_table_no_gradient_reaches_is_left_as_it_is():
  """Every feature of the SGD table without a gradient: its update is
  empty on 2 row-sharded replicas (nothing to exchange), the table as
  initialized, the other tables as on one replica."""
  initial, state, _ = train(2, "row_sharded", frozen=("sgd",))
  _, reference, _ = train(1, frozen=("sgd",))
  np.testing.assert_array_equal(
    state["sgd/parameters"], initial["sgd/parameters"]
  )
  for key, value in reference.items():
    np.testing.assert_allclose(
      state[key], value, rtol=1e-6, atol=1e-7, err_msg=key
    )


@pytest.mark.parametrize(
  "optimizer, identity",
  [
    (E.SGD(0.1), True),
    (E.SGD(0.1, clipvalue=0.5), True),
    (E.SGD(0.1, clipvalue=(0.1, 0.5)), False),  # 0 clipped up to 0.1
    (E.SGD(0.1, weight_decay_factor=0.1), False),
    (E.Adagrad(0.1), True),
    (E.Adagrad(0.1, clip_weight_max=0.2), False),
    (E.Adam(0.1), False),
    (E.AdagradMomentum(0.1, momentum=0.9), False),
    (E.FTRL(0.1), False),
  ],
)
def test_zero_gradient_identity_matches_the_update(optimizer, identity):
  """The predicate the cut relies on against the update itself: rows and
  slots after a step with gradient 0 equal before exactly when it says so."""
  assert optimizers.zero_gradient_is_identity(optimizer) is identity
  rng = np.random.default_rng(0)
  table = tf.Variable(rng.uniform(-1, 1, (5, 3)).astype(np.float32))
  slots = {
    name: tf.Variable(
      init([5, 3], tf.float32)
      + rng.uniform(0.1, 0.5, (5, 3)).astype(np.float32)
    )
    for name, init in optimizers.slot_initializers(optimizer).items()
  }
  before = [table.numpy()] + [s.numpy() for s in slots.values()]
  optimizers.apply_sparse_update(
    optimizer, table, slots, tf.constant([1, 3]), tf.zeros([2, 3])
  )
  after = [table.numpy()] + [s.numpy() for s in slots.values()]
  unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
  assert unchanged is identity


def test_static_cut_compiles_with_xla_as_a_tpu_step_would():
  """The static engine's cut (fixed-size slots) under jit_compile, static
  shapes only: the reached rows first in order, the rest repeating slot 0
  and its gradient, as eagerly."""
  from backends.table_step import TableStep

  ids = tf.constant([7, 3, 9, 4, 0, 0], tf.int64)  # 4 unique, 2 spare slots
  grads = tf.reshape(tf.range(12, dtype=tf.float32), [6, 2])
  trained_index = tf.constant([1, 3, 1, 5], tf.int32)  # slot 5: spare
  trained_valid = tf.constant([True, True, True, False])

  def cut(ids, grads, index, valid):
    step = TableStep([0, 1], ids, tf.constant(4), 6, None, None)
    rows = gradient_rows.reached(index, 6, bound=4, valid=valid)
    step, out = gradient_rows.compact(step, grads, rows)
    return step.ids, step.num_unique, out

  want = cut(ids, grads, trained_index, trained_valid)
  got = tf.function(cut, jit_compile=True)(
    ids, grads, trained_index, trained_valid
  )
  np.testing.assert_array_equal(want[0], [3, 4, 3, 3])
  assert int(want[1]) == 2
  np.testing.assert_array_equal(want[2], [[2, 3], [6, 7], [2, 3], [2, 3]])
  for w, g in zip(want, got):
    np.testing.assert_array_equal(w, g)
