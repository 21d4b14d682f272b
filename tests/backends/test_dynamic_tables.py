"""Dynamic-vocabulary tables on the tensorcore backend, against NumPy.

The index itself is tested against its NumPy twin
(`test_vocabulary_index.py`); here, what the backend does with it: each
step's raw ids reach the rows the index gives them, a row given to a new id
starts again at its initial values in the table and every slot, unknown ids
read the table's default, and the table trains as a NumPy table would
under the same row assignments (`backends.reference_optimizers`). Then the
same stream on 2 replicas (replicated and row-sharded) and in a compiled
step equals one replica, and a checkpoint taken mid-stream resumes exactly.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import inputs as inputs_lib
from backends import reference_optimizers as ref
from backends.layout import Placement, TableLayout
from backends.tensorcore.backend import TensorCoreEmbedding
from backends.vocabulary import (
  DynamicVocabulary,
  HashedIds,
  HashedIndex,
  VocabularyIndex,
)
from tests.backends import tf_v0_on_cpu
from tests.backends.replica_steps import strategy_for

embedding = tf.tpu.experimental.embedding

CAPACITY, DIM = 8, 3


def _stream(steps: int = 6, batch: int = 8, seed: int = 0) -> list[np.ndarray]:
  """Raw int64 ids that drift: each step draws from a window that moves
  on, so new ids keep coming and the table fills and evicts."""
  rng = np.random.default_rng(seed)
  out = []
  for step in range(steps):
    window = np.arange(3 * step, 3 * step + 12, dtype=np.int64)
    out.append(rng.choice(window, size=batch) * 1_000_003 - 2**40)
  return out


def _table(combiner="sum"):
  return embedding.TableConfig(
    vocabulary_size=CAPACITY, dim=DIM, name="t", combiner=combiner
  )


def _tables(
  optimizer,
  policy,
  placement=Placement.REPLICATED,
  strategy=None,
  fused_kernels=True,
  combiner="sum",
):
  table = _table(combiner)
  emb = TensorCoreEmbedding(
    {"f": embedding.FeatureConfig(table=table)},
    optimizer,
    strategy,
    layouts={"t": TableLayout(placement, vocabulary=policy)},
    fused_kernels=fused_kernels,
  )
  with (strategy or tf.distribute.get_strategy()).scope():
    emb.build()
  return emb, table


def _cotangent(step: int, n: int) -> np.ndarray:
  return np.linspace(-1.0, 1.0, n * DIM, dtype=np.float32).reshape(n, DIM) * (
    1 + step
  )


def _numpy_run(stream, optimizer, policy):
  """The expected tables, slots and activations: the rows a separate index
  assigns, a reset to the initial values where it says, NumPy updates."""
  static, table = _tables(
    optimizer, None
  )  # the same rows' initial values (row-keyed)
  initial = static.embedding_tables[table].numpy().astype(np.float64)
  start_slots = ref.initial_slots(optimizer, CAPACITY, DIM)
  kind = HashedIndex if isinstance(policy, HashedIds) else VocabularyIndex
  index = kind("t", CAPACITY, policy)
  values, slots = initial.copy(), {k: v.copy() for k, v in start_slots.items()}
  acts = []
  for step, ids in enumerate(stream):
    update = index.update(tf.constant(ids), tf.constant(step, tf.int64))
    rows = update.rows.numpy()
    if policy.unknown == "unknown_row":
      rows = np.where(rows < 0, CAPACITY - 1, rows)
    reset = update.reset_rows.numpy()
    values[reset] = initial[reset]
    for k in slots:
      slots[k][reset] = start_slots[k][reset]
    known = rows >= 0
    act = np.zeros((len(ids), DIM))
    act[known] = values[rows[known]]
    acts.append(act)
    grads = _cotangent(step, len(ids))
    if known.any():
      unique, summed = ref.sum_duplicates(rows[known], grads[known])
      values, slots = ref.apply(optimizer, values, slots, unique, summed)
  return values, slots, acts, index


def _train(emb, stream, replicas=1, jit_compile=False, first_step=0):
  """Each step: the ids mapped in one `strategy.run`, then the (maybe
  compiled) replica step; replica r takes the r-th contiguous share."""
  strategy = emb.strategy
  acts_seen = []

  def replica_step(ids, cot):
    acts = emb.lookup({"f": ids}, training=True)
    emb.apply_gradients({"f": cot})
    return acts["f"]

  inner = (
    tf.function(replica_step, jit_compile=True)
    if jit_compile
    else (replica_step)
  )

  @tf.function
  def step(ids, cot):
    mapped = strategy.run(lambda i: emb.map_ids({"f": i}, True)["f"], (ids,))
    return strategy.run(inner, (mapped, cot))

  for k, ids in enumerate(stream, start=first_step):
    cot = _cotangent(k, len(ids))
    share = len(ids) // replicas
    dist = strategy.experimental_distribute_values_from_function(
      lambda ctx, ids=ids, cot=cot: (
        tf.constant(ids[ctx.replica_id_in_sync_group * share :][:share]),
        tf.constant(cot[ctx.replica_id_in_sync_group * share :][:share]),
      )
    )
    out = step(*dist)
    acts_seen.append(
      np.concatenate(
        [a.numpy() for a in strategy.experimental_local_results(out)]
      )
    )
  return acts_seen


def _state(emb, table):
  index = emb.dynamic_tables()["t"]
  return (
    tf.convert_to_tensor(emb.embedding_tables[table]).numpy(),
    {
      k: tf.convert_to_tensor(v).numpy()
      for k, v in emb.slot_variables()["t"].items()
    },
    {k: int(v) for k, v in index.counters().items()},
    [t.numpy() for t in index.mapping()] if hasattr(index, "mapping") else [],
  )


def _assert_same_state(got, want, exact=False):
  """Two `_state`s: tables and slots equal (bit for bit when `exact`, else
  to float32 rounding), counters and the index's mapping exactly."""
  same = (
    np.testing.assert_array_equal
    if exact
    else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  )
  same(got[0], want[0])
  for k in want[1]:
    same(got[1][k], want[1][k])
  assert got[2] == want[2]
  for a, b in zip(got[3], want[3]):
    np.testing.assert_array_equal(a, b)


def _assert_trains_as_numpy(emb, table, optimizer, policy) -> dict:
  """`emb` on `_stream()` reads and trains as `_numpy_run` says; returns
  its counters."""
  stream = _stream()
  want_values, want_slots, want_acts, want_index = _numpy_run(
    stream, OPTIMIZERS[optimizer](), POLICIES[policy]
  )
  acts = _train(emb, stream)
  values, slots, counters, mapping = _state(emb, table)
  for got, want in zip(acts, want_acts):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(values, want_values, rtol=1e-6, atol=1e-6)
  for k in want_slots:
    np.testing.assert_allclose(slots[k], want_slots[k], rtol=1e-6, atol=1e-6)
  assert counters == {k: int(v) for k, v in want_index.counters().items()}
  if policy == "hashed":  # the same rows as hashing them by hand
    rows = want_index.lookup(tf.constant(np.concatenate(stream))).numpy()
    assert rows.min() >= 0 and rows.max() < CAPACITY
    return counters
  for got, want in zip(mapping, want_index.mapping()):
    np.testing.assert_array_equal(got, want.numpy())
  return counters


POLICIES = {
  "lru": DynamicVocabulary(),
  "lfu-unknown_row": DynamicVocabulary(eviction="lfu", unknown="unknown_row"),
  "admit2-age": DynamicVocabulary(admit_after=2, eviction="age", max_age=2),
  "none": DynamicVocabulary(eviction="none"),
  "hashed": HashedIds(seed=7),
}
OPTIMIZERS = {
  "sgd": lambda: embedding.SGD(0.25),
  "adagrad": lambda: embedding.Adagrad(0.25, initial_accumulator_value=0.5),
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_table_trains_as_numpy_on_the_rows_the_index_gives(
  policy, optimizer
):
  """Raw ids read the rows the index assigns; a row given to a new id starts
  again from its initial values (table and slots); unknown ids read zeros
  or the unknown row and train nothing else."""
  emb, table = _tables(OPTIMIZERS[optimizer](), POLICIES[policy])
  counters = _assert_trains_as_numpy(emb, table, optimizer, policy)
  assert policy in ("none", "hashed") or counters["evictions"] > 0, counters


@pytest.mark.parametrize(
  "replicas,placement,jit",
  [
    (2, Placement.REPLICATED, False),
    (2, Placement.ROW_SHARDED, False),
    (1, Placement.REPLICATED, True),
  ],
  ids=["2-replicated", "2-row_sharded", "1-compiled"],
)
def test_replicas_layouts_and_compiled_steps_equal_one_replica(
  replicas, placement, jit
):
  """The indices see every replica's ids in the global batch's order: the
  same admissions, evictions and resets as one replica on the whole batch,
  whatever the table's layout, compiled or not."""
  stream = _stream(steps=5)
  policy = POLICIES["lfu-unknown_row"]
  one, table = _tables(embedding.Adagrad(0.25), policy)
  want_acts = _train(one, stream)
  want = _state(one, table)
  many, table = _tables(
    embedding.Adagrad(0.25), policy, placement, strategy_for(replicas)
  )
  acts = _train(many, stream, replicas, jit_compile=jit)
  got = _state(many, table)
  for a, b in zip(acts, want_acts):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  _assert_same_state(got, want)


def test_a_checkpoint_mid_stream_resumes_exactly(tmp_path):
  """The indices (ids, rows, counts, ages, sketch, counters) and the step
  clock are saved with the tables: a restore continues as if never
  stopped."""
  stream = _stream(steps=6)
  policy = DynamicVocabulary(admit_after=2, eviction="age", max_age=2)
  whole, table = _tables(embedding.Adagrad(0.25), policy)
  _train(whole, stream)
  first, _ = _tables(embedding.Adagrad(0.25), policy)
  _train(first, stream[:3])
  path = tf.train.Checkpoint(embedding=first).save(str(tmp_path / "ckpt"))
  second, table2 = _tables(embedding.Adagrad(0.25), policy)
  tf.train.Checkpoint(embedding=second).restore(path).assert_consumed()
  _train(second, stream[3:], first_step=3)
  want, got = _state(whole, table), _state(second, table2)
  _assert_same_state(got, want, exact=True)


def test_a_training_mapping_inside_a_compiled_step_is_refused():
  """Hash tables have no XLA kernel: mapping inside a compiled step is an
  error that says where to map instead, not a failure deep in XLA."""
  emb, _ = _tables(embedding.SGD(0.1), DynamicVocabulary())

  @tf.function(jit_compile=True)
  def step(ids):
    return emb.map_ids({"f": ids}, training=True)["f"]

  with pytest.raises(ValueError, match="map_ids outside strategy.run"):
    step(tf.constant([5, 6], tf.int64))


def test_evaluation_reads_the_index_and_changes_nothing():
  """`map_ids(training=False)`: admitted ids read their rows, others the
  default; no counter, row or age moves."""
  emb, table = _tables(embedding.SGD(0.1), POLICIES["lfu-unknown_row"])
  stream = _stream(steps=3)
  _train(emb, stream)
  before = _state(emb, table)
  keys, rows = emb.dynamic_tables()["t"].mapping()
  probe = tf.concat([keys, tf.constant([123456789], tf.int64)], 0)
  got = emb.map_ids({"f": probe}, training=False)["f"].numpy()
  np.testing.assert_array_equal(got, np.append(rows.numpy(), CAPACITY - 1))
  after = _state(emb, table)
  assert after[2] == before[2]
  np.testing.assert_array_equal(after[0], before[0])


@pytest.mark.parametrize("fused_kernels", [True, False])
def test_padded_bags_map_as_their_ragged_bags_cut_ones_included(
  fused_kernels,
):
  """Padded bags (a bag longer than the width cut, garbage past each
  length) map, training and then evaluating, to the rows the same bags
  give ragged: each bag's first `min(length, W)` ids, 0 after."""
  cut = [[5, 7, 5], [], [9, 7, 11], [2**40]]  # the third was 5 ids long
  ids = np.array([[5, 7, 5], [-3, 8, 1], [9, 7, 11], [2**40, 99, 98]])
  lengths = np.array([3, 0, 5, 1], np.int32)
  inputs = {
    "padded": inputs_lib.PaddedBags(
      tf.constant(ids, tf.int64), tf.constant(lengths), tf.zeros([4, 0])
    ),
    "ragged": tf.ragged.constant(cut, tf.int64),
  }
  got = {}
  for kind, inp in inputs.items():
    emb, _ = _tables(
      embedding.SGD(0.1), DynamicVocabulary(), fused_kernels=fused_kernels
    )
    got[kind] = [
      emb.map_ids({"f": inp}, training)["f"] for training in (True, False)
    ]
  for padded, ragged in zip(got["padded"], got["ragged"]):
    want = np.zeros((4, 3), np.int64)
    for b, bag in enumerate(ragged.to_list()):
      want[b, : len(bag)] = bag
    np.testing.assert_array_equal(padded.ids.numpy(), want)
    np.testing.assert_array_equal(padded.lengths.numpy(), lengths)


@pytest.mark.parametrize(
  "saved,restored,message",
  [
    (DynamicVocabulary(), None, "was trained dynamic"),
    (None, DynamicVocabulary(), "has no index for it"),
    (
      DynamicVocabulary(),
      DynamicVocabulary(eviction="age", max_age=3),
      "another DynamicVocabulary policy",
    ),
    (
      DynamicVocabulary(),
      DynamicVocabulary(shards=2),
      r"holds \['admissions'.*this run's \['shards/admissions'",
    ),
    (
      DynamicVocabulary(shards=3),
      DynamicVocabulary(shards=2),
      r"shards/admissions \[3, 1\] \(this run's \[2, 1\]\)",
    ),
  ],
  ids=[
    "dynamic-into-static",
    "static-into-dynamic",
    "another-policy",
    "whole-into-shards",
    "other-shards",
  ],
)
def test_a_checkpoint_whose_index_does_not_match_is_refused(
  tmp_path, saved, restored, message
):
  """Before anything is restored, naming the table and what to do: a
  dynamic table's index missing, one the run's table would ignore, or one
  written under another policy (other state)."""
  from backends import checkpoint as checkpoint_lib

  first, _ = _tables(embedding.SGD(0.1), saved)
  if saved is not None:
    _train(first, _stream(steps=2))
  path = tf.train.Checkpoint(embedding=first).save(str(tmp_path / "ckpt"))
  second, _ = _tables(embedding.SGD(0.1), restored)
  with pytest.raises(checkpoint_lib.CheckpointMismatchError, match=message):
    checkpoint_lib.verify_compatible(path, second)


def test_a_tpu_strategy_takes_dynamic_tables():
  """On a TPU the indices stay on the host (the Trainer maps each batch
  outside the replica step: tests/training/test_dynamic_training.py), so
  a TPU strategy (faked: no TPU here) takes the layout, as CPU does, and
  its batches stay on the host for the mapping."""
  from tests.backends.test_selection import fake_tpu_strategy

  table = embedding.TableConfig(vocabulary_size=CAPACITY, dim=DIM, name="t")
  emb = TensorCoreEmbedding(
    {"f": embedding.FeatureConfig(table=table)},
    embedding.SGD(0.1),
    fake_tpu_strategy("UNSUPPORTED"),
    layouts={"t": TableLayout(vocabulary=DynamicVocabulary())},
  )
  assert emb.layouts()["t"].dynamic
  # Raw ids stay on the host, where each batch is mapped (CPU: the default).
  assert emb.input_options().experimental_fetch_to_device is False
  cpu, _ = _tables(embedding.SGD(0.1), DynamicVocabulary())
  assert cpu.input_options().experimental_fetch_to_device is True


def test_an_initializer_that_cannot_reset_a_row_is_refused_when_built():
  """A Constant of a whole array has no value for a row known only in a
  step: refused when the tables are built, naming the table, not failed
  inside the first step's trace."""
  from backends.errors import BackendSettingsError

  array = np.zeros((CAPACITY, DIM), np.float32)
  table = embedding.TableConfig(
    vocabulary_size=CAPACITY,
    dim=DIM,
    name="t",
    initializer=tf.constant_initializer(array),
  )
  emb = TensorCoreEmbedding(
    {"f": embedding.FeatureConfig(table=table)},
    embedding.SGD(0.1),
    layouts={"t": TableLayout(vocabulary=DynamicVocabulary())},
  )
  with pytest.raises(BackendSettingsError, match=r"table 't'.*Constant"):
    emb.build()


# -- TF's own TPUEmbeddingV0 (the tpu_embedding_v0 backend) on CPU -----------


@pytest.fixture
def v0_on_cpu(monkeypatch):
  """TF's `TPUEmbeddingV0` itself, on CPU (`tests/backends/tf_v0_on_cpu`)."""
  return tf_v0_on_cpu.allow(monkeypatch)


def _v0_tables(
  v0_class, optimizer, policy, strategy=None, build=True, combiner="sum"
):
  """The V0 backend with `_tables`' table, its values those of the
  row-keyed initializer `_tables` gives (TF's V0 draws its own)."""
  table = _table(combiner)
  emb = v0_class(
    {"f": embedding.FeatureConfig(table=table)},
    optimizer,
    strategy,
    layouts={"t": TableLayout(vocabulary=policy)},
  )
  if build:
    _v0_start_like_tensorcore(emb, table)
  return emb, table


def _v0_start_like_tensorcore(emb, table):
  with emb.strategy.scope():
    emb.build()
  static, static_table = _tables(embedding.SGD(0.1), None)
  emb.embedding_tables[table].assign(static.embedding_tables[static_table])


@pytest.mark.parametrize("policy", ["lru", "lfu-unknown_row", "admit2-age"])
def test_tf_v0_trains_as_numpy_on_the_rows_the_index_gives(v0_on_cpu, policy):
  """The V0 backend maps raw ids with the same index, resets a reused row
  and its slots in TF's variables, and leaves a "zeros" table's unknown
  ids out (zeros, no training): the NumPy run of the tensorcore test."""
  emb, table = _v0_tables(v0_on_cpu, OPTIMIZERS["adagrad"](), POLICIES[policy])
  counters = _assert_trains_as_numpy(emb, table, "adagrad", policy)
  assert counters["evictions"] > 0, counters
  if policy == "admit2-age":
    assert counters["default_hits"] > 0, counters


def test_tf_v0_on_two_replicas_equals_one_and_resumes_from_a_checkpoint(
  v0_on_cpu, tmp_path
):
  """2 replicas (each replica's copy of a reused row reset by itself) end
  as one; a checkpoint taken mid-stream and restored before the backend is
  built (the index restored when made, TF's variables by TF) resumes
  exactly."""
  stream = _stream(steps=6)
  policy = POLICIES["admit2-age"]
  one, table = _v0_tables(v0_on_cpu, embedding.Adagrad(0.25), policy)
  _train(one, stream)
  want = _state(one, table)
  two, table2 = _v0_tables(
    v0_on_cpu, embedding.Adagrad(0.25), policy, strategy_for(2)
  )
  _train(two, stream, replicas=2)
  got = _state(two, table2)
  _assert_same_state(got, want)

  first, _ = _v0_tables(v0_on_cpu, embedding.Adagrad(0.25), policy)
  _train(first, stream[:3])
  path = tf.train.Checkpoint(embedding=first).save(str(tmp_path / "ckpt"))
  second, table3 = _v0_tables(
    v0_on_cpu, embedding.Adagrad(0.25), policy, build=False
  )
  status = tf.train.Checkpoint(embedding=second).restore(path)
  with second.strategy.scope():
    second.build()
  status.assert_consumed()
  _train(second, stream[3:], first_step=3)
  resumed = _state(second, table3)
  _assert_same_state(resumed, want, exact=True)


@pytest.mark.parametrize(
  "kind,combiner,weighted",
  [
    ("ragged", "mean", True),
    ("sparse", "sqrtn", False),
    ("ragged", "sum", False),
    ("sparse", "mean", True),
  ],
)
def test_tf_v0_leaves_unknown_ids_out_of_bags_as_tensorcore_does(
  v0_on_cpu, kind, combiner, weighted
):
  """Bags of a "zeros" table: the ids without a row (admitted after their
  second occurrence) are left out of the bag, with their weights (V0: as
  weight 0, which every combiner leaves out), on TF's V0 as on
  tensorcore: the same activations and the same training."""
  policy = DynamicVocabulary(admit_after=2)
  bags = [
    [[5, 7], [7], [9, 5, 11]],
    [[7, 13], [5, 5], [11]],
    [[13], [9, 13], [21, 23]],  # not 5 or 7: their rows are not read
  ]
  raw = [np.array(b, dtype=object) for b in bags]
  built = {}
  for name, make in {
    # Adam: an update of a row the step did not read (a left-out id's
    # row 0, with zero gradient) would still move it.
    "tensorcore": lambda: _tables(
      embedding.Adam(0.25), policy, combiner=combiner
    ),
    "v0": lambda: _v0_tables(
      v0_on_cpu, embedding.Adam(0.25), policy, combiner=combiner
    ),
  }.items():
    emb, table = make()
    seen = []
    for step, b in enumerate(raw):
      ids = tf.ragged.constant(list(b), dtype=tf.int64) * 1_000_003
      weights = tf.ragged.map_flat_values(
        lambda v: tf.cast(v % 3 + 1, tf.float32) / 2, ids
      )
      if kind == "sparse":
        ids, weights = ids.to_sparse(), weights.to_sparse()
      mapped = emb.map_ids({"f": ids}, training=True)
      given = {"f": weights} if weighted else None
      acts = emb.lookup(mapped, given, training=True)["f"]
      seen.append(acts.numpy())
      emb.apply_gradients({"f": tf.constant(_cotangent(step, 3))})
    built[name] = (seen, _state(emb, table))
  (want_acts, want), (got_acts, got) = built["tensorcore"], built["v0"]
  for a, b in zip(got_acts, want_acts):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert np.all(want_acts[2][2] == 0)  # 21 and 23 seen once: no row yet
  assert not np.all(want_acts[2][1] == 0)
  _assert_same_state(got, want)
  assert got[2]["default_hits"] > 0
