"""The row-sharded tables' exchanges: all-to-all against all-gather.

References: a 1-replica replicated table on the same global batches (the
numbers), NumPy draws of ids spread over owners (the capacity's odds), the
collectives' operand sizes in the traced step (the planner's byte counts),
and an all-to-all that cannot hold a step's ids (a clear error, never a
silent zero row).
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import _tf_internal, placement
from backends.layout import TableLayout
from backends.storage import exchange as exchange_lib
from backends.storage import row_layout
from backends.tensorcore.backend import TensorCoreEmbedding
from backends.vocabulary import DynamicVocabulary
from tests.backends import test_compiled_path as compiled
from tests.backends import test_row_sharded as sharded_case
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding


def test_owner_capacity_holds_uniform_spreads():
  """5 sigmas: no overflow in 20,000 NumPy draws of U ids over R owners."""
  rng = np.random.default_rng(0)
  for ids, replicas in ((512, 2), (512, 8), (2560, 4), (64, 8)):
    k = placement.owner_capacity(ids, replicas)
    assert ids / replicas < k <= ids
    counts = rng.multinomial(ids, [1 / replicas] * replicas, size=20_000)
    assert counts.max() <= k, (ids, replicas, k, counts.max())
  assert placement.owner_capacity(100, 1) == 100


def test_traffic_per_replica_is_flat_in_the_replica_count():
  """Fixed ids per replica: all-to-all's bytes within 1.2x from 2 to 8
  replicas (a 16-dim table, 2,560 ids per replica: DLRM's widest
  multi-hot feature at 512 examples per replica); all-gather's grow ~R."""
  a2a = [placement.exchange_bytes("all_to_all", 2560, r, 64) for r in (2, 4, 8)]
  gather = [
    placement.exchange_bytes("all_gather", 2560, r, 64) for r in (2, 4, 8)
  ]
  assert max(a2a) / min(a2a) <= 1.2, a2a
  assert gather[2] / gather[0] > 2.5, gather
  assert a2a[0] < gather[0]  # even on 2 replicas


@pytest.mark.parametrize(
  "replicas,static,exchange",
  [
    pytest.param(2, False, "all_gather", id="2-dynamic-all_gather"),
    pytest.param(2, True, "all_gather", id="2-static-all_gather"),
    pytest.param(4, True, "all_to_all", id="4-static-all_to_all"),
  ],
)
def test_both_exchanges_equal_one_replica(replicas, static, exchange):
  """(test_row_sharded runs the default all-to-all on 2 and 4 replicas.)"""
  emb = sharded_case.trained(
    replicas,
    static,
    layouts=TableLayout(
      "row_sharded", row_layout="contiguous", exchange=exchange
    ),
  )
  held = {name: held.exchange for name, held in emb.layouts().items()}
  assert held == {name: exchange for name in emb.placements()}
  compiled.assert_close(
    sharded_case.state(sharded_case.trained(1, static)),
    sharded_case.state(emb),
  )


def _collective_bytes(emb, strategy, features) -> dict[str, int]:
  """Bytes each collective op type gets as input on replica 0, traced."""

  @tf.function
  def step(features):
    def replica_step(f):
      with tf.GradientTape() as tape:
        acts = emb(f, training=True)
        tape.watch(acts)
        loss = tf.add_n([tf.reduce_sum(a) for a in acts.values()])
      emb.apply_gradients(tape.gradient(loss, acts))

    strategy.run(replica_step, args=(features,))

  graph = step.get_concrete_function(features).graph
  out: dict[str, int] = {}
  for op in graph.get_operations():
    if op.type.startswith("Collective") and "replica_" not in op.name:
      value = op.inputs[0]
      size = value.shape.num_elements() * value.dtype.size
      out[op.type] = out.get(op.type, 0) + size
  return out


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_plans_bytes_are_the_steps_collectives(replicas):
  """The planner's all-to-all bytes equal what the traced step sends."""
  strategy = mirrored_strategy(replicas)
  vocab, dim, width, batch = 101, 6, 3, 8  # per replica: 24 ids
  table = E.TableConfig(vocab, dim, name="t")
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      E.Adagrad(0.1),
      strategy,
      bag_widths=width,
      layouts=TableLayout("row_sharded"),
      static_shapes=True,
    )
    emb.build()
  ids = np.random.default_rng(1).integers(0, vocab, (batch, width))
  features = {"f": tf.constant(ids)}
  sent = _collective_bytes(emb, strategy, emb.preprocess(features)[0])
  want = placement.exchange_bytes(
    "all_to_all", batch * width, replicas, dim * 4
  )
  assert sent == {"CollectiveAllToAllV2": want}


def _ones_table(strategy, name, rows, layout):
  """A row-sharded table of ones (every bag's mean exact), bags of 4."""
  table = E.TableConfig(
    rows, 3, name=name, initializer=tf.keras.initializers.Ones()
  )
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      E.SGD(0.1),
      strategy,
      bag_widths=4,
      layouts=layout,
    )
    emb.build()
  return emb


def _skewed_case(strategy, sigmas):
  """Contiguous rows; every id of the batch in owner 0's range."""
  return _ones_table(
    strategy, "hot", 40, TableLayout("row_sharded", exchange_sigmas=sigmas)
  )


def test_an_overflowing_bucket_fails_the_step_naming_the_table():
  strategy = mirrored_strategy(2)
  emb = _skewed_case(strategy, sigmas=0.5)
  # Each replica looks up 16 distinct ids, all owned by replica 0 (rows
  # 0..19 of 40).
  ids = tf.constant(np.arange(16).reshape(4, 4), tf.int64)
  features = emb.preprocess({"f": ids})[0]

  def lookup(emb):
    @tf.function
    def step(features):
      def replica_step(f):
        return emb(f, training=False)["f"]

      return strategy.run(replica_step, args=(features,))

    return strategy.experimental_local_results(step(features))

  capacity = placement.owner_capacity(16, 2, 0.5)
  assert capacity < 16
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=rf"table `hot`: in one step a replica sent 16 ids to one owner, "
    rf"over the all-to-all exchange`s capacity of {capacity} per owner",
  ):
    lookup(emb)
  # With the default margin the same step reads the right rows.
  assert placement.owner_capacity(16, 2) == 16
  acts = lookup(_skewed_case(strategy, sigmas=placement.CAPACITY_SIGMAS))
  # Rows of ones: every mean is exact.
  np.testing.assert_array_equal(np.concatenate(acts), np.ones((8, 3)))


def _filling_case(strategy, shards):
  """An empty dynamic table row-sharded in contiguous halves over the
  replicas, the all-to-all with a thin margin; its index in `shards`."""
  return _ones_table(
    strategy,
    "new",
    64,
    TableLayout(
      "row_sharded",
      row_layout="contiguous",
      exchange="all_to_all",
      exchange_sigmas=0.5,
      vocabulary=DynamicVocabulary(shards=shards),
    ),
  )


def _first_step(emb, strategy, raw):
  """Maps each replica's raw ids (training: the index admits them), then
  looks their rows up; each replica's activations and rows."""

  @tf.function
  def step(ids):
    def replica_step(f):
      rows = emb.map_ids({"f": f}, training=True)["f"]
      return emb({"f": rows}, training=False)["f"], rows

    return strategy.run(replica_step, args=(ids,))

  ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(raw[ctx.replica_id_in_sync_group])
  )
  acts, rows = step(ids)
  return (
    [a.numpy() for a in strategy.experimental_local_results(acts)],
    [r.numpy() for r in strategy.experimental_local_results(rows)],
  )


def test_index_shards_split_as_the_rows_keep_a_filling_table_in_bounds():
  """An empty table's index hands out rows in ascending order: in one
  index, a first step's 32 new ids take rows 0-31, all replica 0's, and
  each replica's 16 overflow the all-to-all's bucket (its margin thin
  here; the planner gives such a table the all-gather). In 2 index shards,
  one a half of the rows, each id's shard is its hash: the ids reach both
  owners, within the bucket, and read their rows."""
  strategy = mirrored_strategy(2)
  raw = (np.arange(32, dtype=np.int64) * 7919 + 2**40).reshape(2, 4, 4)
  capacity = placement.owner_capacity(16, 2, 0.5)
  assert capacity < 16
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"table `new`: in one step a replica sent 16 ids to one owner",
  ):
    _first_step(_filling_case(strategy, 1), strategy, raw)
  acts, rows = _first_step(_filling_case(strategy, 2), strategy, raw)
  for replica_rows in rows:
    owners = np.bincount(replica_rows.ravel() // 32, minlength=2)
    assert owners.min() > 0 and owners.max() <= capacity, owners
  assert len(np.unique(np.concatenate(rows))) == 32  # a row an id
  np.testing.assert_array_equal(np.concatenate(acts), np.ones((8, 3)))


def test_the_compiled_exchange_has_static_shapes_and_counts_overflow(
  monkeypatch,
):
  """4 owners simulated in one compiled function (XLA on CPU compiles no
  collectives): the all-to-all's ids, rows and gradients have static shapes
  only, and a full bucket is counted for the host to raise, not dropped
  silently."""
  num, vocab, dim, ids_per_replica = 4, 400, 3, 40
  layout = row_layout.make("contiguous", vocab, num)
  k = placement.owner_capacity(ids_per_replica, num)
  exchange = exchange_lib.AllToAll(layout, k)
  shard = tf.Variable(tf.ones([100, dim]))
  # A fake all-to-all: replica 0 receives its own buckets back (shapes are
  # what XLA checks; the numbers are checked on real replicas above).
  monkeypatch.setattr(_tf_internal, "all_to_all", lambda ctx, value: value)

  @tf.function(jit_compile=True)
  def step(ids, valid):
    rows, record = exchange.lookup(
      None, shard, ids, valid, ids_per_replica, "t"
    )
    local, owned, grads = exchange.gradients(None, record, tf.ones_like(rows))
    return rows, local, owned, grads, exchange.overflow(record)

  spread = tf.constant(np.arange(0, vocab, 10), tf.int64)  # 10 per owner
  valid = tf.ones([ids_per_replica], tf.bool)
  hlo = step.experimental_get_compiler_ir(spread, valid)(stage="hlo")
  assert "<=" not in hlo
  *_, over = step(spread, valid)
  assert int(over) == 0
  crowded = tf.constant(np.arange(ids_per_replica), tf.int64)  # owner 0's
  rows, *_, over = step(crowded, valid)
  assert int(over) == ids_per_replica - k > 0
  # The ids that fit read their rows; the others are left out (counted).
  assert int(tf.reduce_sum(rows[:, 0])) == k
