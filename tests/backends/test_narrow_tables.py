"""bfloat16 / float16 tables (`backends.storage.narrow`) against NumPy
references.

References: NumPy's own neighbours of a float32 value in float16 and
(by the bits) bfloat16 for the stochastic rounding; a NumPy `lowbias32`
for its draws; `backends.reference_optimizers` (float64) for training; the
float32 table's bytes for the planner; the float32 run for checkpoints and
the compiled step.
"""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from backends import checkpoint as checkpoint_lib
from backends import optimizers, placement
from backends import reference_optimizers as ref
from backends.layout import TableLayout
from backends.storage import narrow
from backends.tensorcore import kernels
from backends.tensorcore.backend import TensorCoreEmbedding
from recsys import planning
from tests.backends.replica_steps import strategy_for, train_split
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
NARROW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
VOCAB, DIM = 40, 6


# -- the rounding ------------------------------------------------------------


def _np_mix(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.uint64)
  m = np.uint64(0xFFFFFFFF)
  x ^= x >> np.uint64(16)
  x = (x * np.uint64(0x7FEB352D)) & m
  x ^= x >> np.uint64(15)
  x = (x * np.uint64(0x846CA68B)) & m
  x ^= x >> np.uint64(16)
  return x


def _np_bits(seed, step, ids, dim):
  """`narrow.random_bits` written again in NumPy (ids, step below 2**32)."""
  key = _np_mix(np.array([(seed ^ 0x9E3779B9) & 0xFFFFFFFF]))
  key = _np_mix(key ^ np.uint64(step))
  key = _np_mix(key ^ np.uint64(0))  # the step's high bits
  rows = _np_mix(key ^ np.asarray(ids, np.uint64))
  rows = _np_mix(rows ^ np.uint64(0))  # the ids' high bits
  cols = _np_mix(np.arange(dim, dtype=np.uint64) + np.uint64(0x632BE5AB))
  bits = ((rows[:, None] ^ cols[None, :]) * np.uint64(0x846CA68B)) & np.uint64(
    0xFFFFFFFF
  )
  return bits ^ (bits >> np.uint64(16))


def _np_neighbours(x: np.ndarray, dtype_name: str):
  """The narrow values just below and above |x| (equal when exact)."""
  a = np.abs(x.astype(np.float32))
  if dtype_name == "bfloat16":  # bfloat16 is the top 16 bits of float32
    low = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    high = (low.view(np.uint32) + np.uint32(0x10000)).view(np.float32)
  else:
    n = a.astype(np.float16)
    low = np.where(n.astype(np.float32) > a, np.nextafter(n, np.float16(0)), n)
    high = np.nextafter(low, np.float16(np.inf))
    low, high = low.astype(np.float32), high.astype(np.float32)
  return a, low.astype(np.float64), high.astype(np.float64)


def test_the_draws_are_the_numpy_hash_of_seed_step_row_and_column():
  ids = np.array([0, 3, 17, 2**31 + 5])
  got = narrow.random_bits(11, tf.constant(7, tf.int64), tf.constant(ids), 5)
  assert got.dtype == tf.uint32
  np.testing.assert_array_equal(got.numpy(), _np_bits(11, 7, ids, 5))
  u = narrow.uniforms(got).numpy()
  assert 0.0 <= u.min() and u.max() < 1.0


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_stochastic_rounding_picks_the_numpy_neighbour(dtype_name):
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((50, 8)) * 3).astype(np.float32)
  x[0, :4] = [0.0, 1.0, -2.5, 1e-9]  # exact values and a tiny one
  bits = rng.integers(0, 2**32, size=(50, 8), dtype=np.uint64)
  dtype = tf.as_dtype(dtype_name)
  got = narrow.round_stochastically(
    tf.constant(x), dtype, tf.constant(bits.astype(np.uint32))
  )
  assert got.dtype == dtype
  a, low, high = _np_neighbours(x, dtype_name)
  if dtype_name == "bfloat16":
    # Up when the draw's top 16 bits carry past the value's low 16 bits.
    low_bits = a.view(np.uint32).astype(np.uint64) & np.uint64(0xFFFF)
    go_up = low_bits + (bits >> np.uint64(16)) >= 2**16
  else:
    draws = (bits >> np.uint64(8)).astype(np.float64) * 2.0**-24
    go_up = draws < (a - low) / np.where(high > low, high - low, 1.0)
  want = np.sign(x) * np.where(go_up, high, low)
  np.testing.assert_array_equal(got.numpy().astype(np.float64), want)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_stochastic_rounding_is_unbiased(dtype_name):
  """The mean of many roundings of one value is that value: a rounding to
  nearest would leave every one of these values where it is."""
  dtype = tf.as_dtype(dtype_name)
  values = np.array([1.003, -0.3001, 7.77, 1e-4 + 3e-8], np.float32)
  n = 20000
  x = tf.constant(np.tile(values, (n, 1)))
  bits = narrow.random_bits(3, tf.constant(1, tf.int64), tf.range(n), 4)
  rounded = narrow.round_stochastically(x, dtype, bits).numpy()
  mean = rounded.astype(np.float64).mean(axis=0)
  _, low, high = _np_neighbours(values, dtype_name)
  # Binomial: the mean's standard deviation is at most gap / (2 sqrt(n)).
  tolerance = 5 * (high - low) / (2 * np.sqrt(n))
  assert np.all(np.abs(mean - values) <= tolerance), (mean, values)
  nearest = values.astype(NARROW[dtype_name]).astype(np.float64)
  assert np.all(np.abs(nearest - values) > tolerance)


# -- training ------------------------------------------------------------------


def _table():
  init = tf.keras.initializers.RandomUniform(-1, 1, seed=4)
  return E.TableConfig(
    VOCAB, DIM, name="items", combiner="sum", initializer=init
  )


def _batches(steps):
  rng = np.random.default_rng(1)
  return [
    (
      rng.integers(0, VOCAB, size=(8, 3)).astype(np.int64),
      rng.standard_normal((8, DIM)).astype(np.float32),
    )
    for _ in range(steps)
  ]


def _train(dtype_name, optimizer, steps=3, jit=False, seed=0, emb=None):
  """`steps` steps of loss = sum(acts * c) (activation gradient c)."""
  table = _table()
  if emb is None:
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      optimizer,
      layouts=TableLayout(dtype=dtype_name),
      rounding_seed=seed,
      bag_widths=3,
    )
  emb.build()

  @tf.function(jit_compile=jit)
  def step(ids, c):
    acts = emb({"f": ids}, training=True)
    emb.apply_gradients({"f": c})
    return acts["f"]

  for ids, c in _batches(steps):
    step(tf.constant(ids), tf.constant(c))
  return emb


def _reference(initial, optimizer, steps=3):
  table = initial.astype(np.float64)
  slots = ref.initial_slots(optimizer, VOCAB, DIM)
  for ids, c in _batches(steps):
    flat = ids.reshape(-1)
    grads = np.repeat(c, ids.shape[1], axis=0)
    unique, summed = ref.sum_duplicates(flat, grads)
    table, slots = ref.apply(optimizer, table, slots, unique, summed)
  return table, slots


OPTIMIZERS = {
  "sgd": lambda: E.SGD(0.05),
  "adagrad": lambda: E.Adagrad(0.1),
  "adam": lambda: E.Adam(0.01),
  "dense_adam": lambda: E.Adam(0.01, lazy_adam=False),
  "adagrad_momentum": lambda: E.AdagradMomentum(0.1, momentum=0.9),
  "ftrl": lambda: E.FTRL(0.1, l1_regularization_strength=0.001),
}


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_narrow_training_tracks_the_float32_reference(dtype_name, opt):
  emb = _train(dtype_name, OPTIMIZERS[opt](), steps=0)
  params = emb.embedding_tables[emb.tables[0]]
  initial = params.numpy().astype(np.float64)
  assert params.dtype == tf.as_dtype(dtype_name)
  _train(dtype_name, None, emb=emb)
  want, want_slots = _reference(initial, OPTIMIZERS[opt]())
  got = params.numpy().astype(np.float64)
  # A few roundings, each within one narrow step of the value.
  eps = 2.0**-8 if dtype_name == "bfloat16" else 2.0**-11
  np.testing.assert_allclose(got, want, atol=4 * eps * np.abs(want).max())
  for name, slot in emb.slot_variables()["items"].items():
    assert slot.dtype == tf.float32, name
    if opt == "adagrad":  # the gradients do not depend on the rows
      np.testing.assert_allclose(slot.numpy(), want_slots[name], rtol=1e-5)


def test_the_same_seed_gives_bit_identical_tables_another_seed_not():
  def run(seed):
    emb = _train("bfloat16", E.Adagrad(0.1), seed=seed)
    return emb.embedding_tables[emb.tables[0]].numpy()

  first, again, other = run(5), run(5), run(6)
  np.testing.assert_array_equal(first.view(np.uint16), again.view(np.uint16))
  assert (first.view(np.uint16) != other.view(np.uint16)).any()


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_the_compiled_step_rounds_as_the_uncompiled_one(dtype_name):
  """The same draws: equal bits, except where XLA's fused multiply-adds (one
  rounding, not two) moved a float32 value across a draw's threshold —
  then one narrow step apart (at most ~2^-13 of the values per step)."""
  eager = _train(dtype_name, E.Adam(0.01), jit=False)
  compiled = _train(dtype_name, E.Adam(0.01), jit=True)
  assert compiled.engine_names[1] == "static"
  got = compiled.embedding_tables[compiled.tables[0]].numpy().view(np.uint16)
  want = eager.embedding_tables[eager.tables[0]].numpy().view(np.uint16)
  apart = got != want
  assert apart.mean() <= 0.01, f"{apart.sum()} of {apart.size} differ"
  steps = np.abs(got[apart].astype(np.int32) - want[apart].astype(np.int32))
  assert (steps == 1).all(), steps  # same sign: neighbours differ by 1 bit


def test_a_narrow_lookup_sums_the_upcast_rows():
  """The lookup of a narrow table (the fused kernels' where built) equals
  the float32 lookup of the same rows upcast."""
  emb = _train("bfloat16", E.Adagrad(0.1), steps=1)
  rows = emb.embedding_tables[emb.tables[0]].numpy().astype(np.float32)
  ids = np.array([[1, 2, 2], [5, 0, 39]])
  got = emb({"f": tf.constant(ids)}, training=True)["f"].numpy()
  emb.abandon_training_lookup()
  np.testing.assert_allclose(got, rows[ids].sum(axis=1), rtol=1e-6)


def test_an_unknown_table_dtype_is_refused_naming_the_table():
  # (A narrow row-sharded table, once refused here, is supported: below.)
  table = _table()
  with pytest.raises(ValueError, match=r"layouts\['items'\].dtype.*bfloat16"):
    TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      E.Adagrad(0.1),
      layouts={"items": TableLayout(dtype="int8")},
    )


# -- bytes and checkpoints ---------------------------------------------------


def test_the_planner_counts_half_the_table_bytes():
  f32 = placement.TableSize("t", 1000, 32, num_slots=1)
  bf16 = placement.TableSize(
    "t", 1000, 32, num_slots=1, dtype_bytes=placement.element_bytes("bfloat16")
  )
  assert f32.row_bytes == 32 * 4 * 2 and bf16.row_bytes == 32 * (2 + 4)
  config = {"f": E.FeatureConfig(E.TableConfig(1000, 32, name="t"))}

  def plan(**requests):
    return planning.plan_memory(
      config,
      E.Adagrad(0.1),
      backend="tensorcore",
      placement=planning.EmbeddingPlacement(**requests),
    ).rows[0]

  wide, half = plan(), plan(table_dtype="bfloat16")
  assert half.table_bytes * 2 == wide.table_bytes == 1000 * 32 * 4
  assert half.slot_bytes == wide.slot_bytes  # slots stay float32
  assert half.bytes_per_device == 1000 * 32 * (2 + 4)


@pytest.mark.parametrize(
  "saved,restored", [("float32", "bfloat16"), ("bfloat16", "float32")]
)
def test_checkpoints_restore_across_dtypes(tmp_path, saved, restored):
  """Saved in the table's own dtype (TF's layout); restored into the other
  by casting, before build (restore on create) and after it (a built
  backend: `casting_tables`): float32 -> narrow rounds to nearest (numpy's
  cast), narrow -> float32 is exact; the slots are restored as they are."""
  source = _train(saved, E.Adagrad(0.1))
  path = tf.train.Checkpoint(embedding=source).save(str(tmp_path / "ckpt"))
  stored = dict(tf.train.list_variables(path))
  keys = [k for k in stored if k.startswith("embedding/items/")]
  assert keys  # TF's mid-level layout: <table>
  reader = tf.train.load_checkpoint(path)
  key = "embedding/items/.ATTRIBUTES/VARIABLE_VALUE"
  assert reader.get_variable_to_dtype_map()[key] == tf.as_dtype(saved)
  saved_rows = source.embedding_tables[source.tables[0]].numpy()
  want = saved_rows.astype(np.float32).astype(NARROW.get(restored, np.float32))
  want_acc = source.slot_variables()["items"]["accumulators"].numpy()

  def target():
    return TensorCoreEmbedding(
      {"f": E.FeatureConfig(_table())},
      E.Adagrad(0.1),
      layouts=TableLayout(dtype=restored),
    )

  unbuilt = target()
  built = target()
  built.build()
  for emb in (unbuilt, built):
    checkpoint_lib.restore(emb, path)
    got = emb.embedding_tables[emb.tables[0]]
    assert got.dtype == tf.as_dtype(restored)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(
      emb.slot_variables()["items"]["accumulators"].numpy(), want_acc
    )
  # The cast is for that restore only: the table saves in its own dtype.
  again = tf.train.Checkpoint(embedding=built).save(str(tmp_path / "again"))
  assert tf.train.load_checkpoint(again).get_variable_to_dtype_map()[
    key
  ] == tf.as_dtype(restored)


def test_a_narrow_checkpoint_restores_into_a_built_narrow_table(tmp_path):
  source = _train("bfloat16", E.Adagrad(0.1))
  path = tf.train.Checkpoint(embedding=source).save(str(tmp_path / "ckpt"))
  target = TensorCoreEmbedding(
    {"f": E.FeatureConfig(_table())},
    E.Adagrad(0.1),
    layouts=TableLayout(dtype="bfloat16"),
  )
  target.build()
  checkpoint_lib.restore(target, path)
  np.testing.assert_array_equal(
    target.embedding_tables[target.tables[0]].numpy(),
    source.embedding_tables[source.tables[0]].numpy(),
  )


def test_two_replicas_keep_identical_narrow_copies():
  """Each replica rounds its copy with the same draws: the copies stay
  bit-identical, and near the one-replica table."""
  strategy = mirrored_strategy(2)
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(_table())},
      E.Adagrad(0.1),
      layouts=TableLayout(dtype="bfloat16"),
      bag_widths=3,
    )
    emb.build()
  train_split(emb, strategy, _batches(3), 2)
  copies = strategy.experimental_local_results(
    emb.embedding_tables[emb.tables[0]]
  )
  first, second = (c.numpy().view(np.uint16) for c in copies)
  np.testing.assert_array_equal(first, second)
  one = _train("bfloat16", E.Adagrad(0.1))
  want = one.embedding_tables[one.tables[0]].numpy().astype(np.float64)
  got = copies[0].numpy().astype(np.float64)
  np.testing.assert_allclose(got, want, atol=4 * 2.0**-8)


def _kernels():
  ops = kernels.load()
  if ops is None:
    pytest.skip("the fused kernels are not built here")
  return ops


def test_the_fused_kernels_refuse_a_table_of_another_dtype():
  """They read float32, bfloat16 and float16 rows; others fail naming it."""
  ops = _kernels()
  table = tf.Variable(tf.zeros([10, 2], tf.float64))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="float32, bfloat16 or float16 matrix"
  ):
    ops.recsys_bag_sums(
      table=table.handle,
      ids=np.array([1, 2], np.int64),
      segments=np.zeros(2, np.int32),
      scale=tf.zeros([0]),
      num_segments=1,
    )


@pytest.mark.parametrize("built", [False, True])
def test_the_serving_backend_restores_a_narrow_checkpoint_exactly(
  tmp_path, built
):
  """TF's `TPUEmbeddingForServing` (float32 tables, no slots) reads a
  bfloat16 checkpoint, unbuilt (restore on create) or built: each value
  exactly, and its lookups are the narrow table's upcast rows."""
  from backends.mid_level.serving import ServingEmbedding  # pylint: disable=g-import-not-at-top

  source = _train("bfloat16", E.Adagrad(0.1))
  path = tf.train.Checkpoint(embedding=source).save(str(tmp_path / "ckpt"))
  serving = ServingEmbedding({"f": E.FeatureConfig(_table())})
  if built:
    serving.build()
  checkpoint_lib.restore(serving, path)
  got = serving.embedding_tables[serving.tables[0]]
  want = source.embedding_tables[source.tables[0]].numpy()
  assert got.dtype == tf.float32
  np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
  ids = tf.constant([[1, 2, 3], [39, 0, 0]], tf.int64)
  # Not bit-exact: TF's serving lookup sums a bag with its own segment op,
  # whose order matches ours only for short bags.
  np.testing.assert_allclose(
    serving.lookup({"f": ids})["f"].numpy(),
    source({"f": ids})["f"].numpy(),
    rtol=1e-6,
  )


# -- row-sharded narrow tables ----------------------------------------------


def _exact_batches(steps):
  """Batches whose activation gradients are multiples of 1/4: their sums
  over replicas are exact in any order, so every replica count computes
  the same float32 rows before rounding."""
  rng = np.random.default_rng(5)
  return [
    (
      rng.integers(0, VOCAB, size=(8, 3)).astype(np.int64),
      (rng.integers(-8, 9, size=(8, DIM)) / 4).astype(np.float32),
    )
    for _ in range(steps)
  ]


def _built(replicas, dtype_name, layouts=None, **options):
  """An Adagrad backend of `_table()` on `replicas`, stored `dtype_name`."""
  strategy = strategy_for(replicas)
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(_table())},
      E.Adagrad(0.1),
      strategy,
      layouts=dataclasses.replace(layouts or TableLayout(), dtype=dtype_name),
      **options,
    )
    emb.build()
  return emb


def _train_sharded(
  replicas, dtype_name="bfloat16", steps=3, layouts=None, **options
):
  """`steps` Adagrad steps on `replicas` (each its slice of every batch)."""
  emb = _built(
    replicas, dtype_name, layouts, rounding_seed=3, bag_widths=3, **options
  )
  train_split(emb, emb.strategy, _exact_batches(steps), replicas)
  return emb


def _bits(emb):
  table = emb.embedding_tables[emb.tables[0]]
  return np.asarray(tf.convert_to_tensor(table).numpy()).view(np.uint16)


@pytest.mark.parametrize("layout", ["strided", "contiguous"])
def test_row_sharded_narrow_tables_are_bit_identical_on_1_2_4_replicas(layout):
  """Each owner rounds its rows with the replicated table's draws, keyed by
  the GLOBAL row id: 1, 2 and 4 replicas, either layout, dynamic or static
  (fixed-size) steps, give the bits of one replicated table (a local row
  id in the hash would not)."""
  want = _bits(_train_sharded(1))
  slots = _train_sharded(1).slot_variables()["items"]["accumulators"].numpy()
  for replicas, static in ((1, False), (2, False), (4, False), (2, True)):
    emb = _train_sharded(
      replicas,
      layouts=TableLayout("row_sharded", row_layout=layout),
      static_shapes=static,
    )
    assert emb.placements() == {"items": "row_sharded"}
    table = emb.embedding_tables[emb.tables[0]]
    assert table.dtype == tf.bfloat16
    np.testing.assert_array_equal(
      _bits(emb), want, err_msg=f"{replicas} replicas, static {static}"
    )
    np.testing.assert_array_equal(
      tf.convert_to_tensor(
        emb.slot_variables()["items"]["accumulators"]
      ).numpy(),
      slots,
    )
  assert np.any(want != _bits(_train_sharded(1, steps=0)))  # it trained


def test_row_sharded_narrow_checkpoints_are_sliced_in_their_dtype(tmp_path):
  """Two contiguous shards save their bfloat16 rows as slices of TF's
  `<table>` tensor (bfloat16); they restore into four shards, a replicated
  table and, cast exactly, a float32 row-sharded one."""
  from backends.storage import row_sharded_checkpoint  # pylint: disable=g-import-not-at-top

  source = _train_sharded(
    2, layouts=TableLayout("row_sharded", row_layout="contiguous")
  )
  root = tf.train.Checkpoint(embedding=source)
  path = row_sharded_checkpoint.save(
    root,
    mirrored_strategy(2),
    lambda options: root.save(str(tmp_path / "ckpt"), options=options),
    chief=True,
  )
  key = "embedding/items/.ATTRIBUTES/VARIABLE_VALUE"
  assert key in row_sharded_checkpoint.sliced_keys(path)
  reader = tf.train.load_checkpoint(path)
  assert reader.get_variable_to_dtype_map()[key] == tf.bfloat16
  want = _bits(source)
  np.testing.assert_array_equal(reader.get_tensor(key).view(np.uint16), want)

  four = _built(
    4, "bfloat16", layouts=TableLayout("row_sharded", row_layout="contiguous")
  )
  checkpoint_lib.restore(four, path)
  np.testing.assert_array_equal(_bits(four), want)
  replicated = _built(1, "bfloat16")
  checkpoint_lib.restore(replicated, path)
  np.testing.assert_array_equal(_bits(replicated), want)
  wide = _built(
    2, "float32", layouts=TableLayout("row_sharded", row_layout="contiguous")
  )
  checkpoint_lib.restore(wide, path)
  got = tf.convert_to_tensor(wide.embedding_tables[wide.tables[0]]).numpy()
  assert got.dtype == np.float32
  np.testing.assert_array_equal(
    got, want.view(ml_dtypes.bfloat16).astype(np.float32)
  )


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_fused_and_tf_op_steps_leave_bit_identical_narrow_tables(
  dtype_name, opt
):
  """The fused kernels read the narrow rows and round their updates with
  the TF ops' draws: the same steps leave the same bits, slots too."""
  _kernels()
  runs = {}
  for fused in (True, False):
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(_table())},
      OPTIMIZERS[opt](),
      layouts=TableLayout(dtype=dtype_name),
      rounding_seed=3,
      bag_widths=3,
      fused_kernels=fused,
    )
    _train(dtype_name, None, steps=4, emb=emb)
    assert emb.engine_names[0] == ("fused" if fused else "tf_ops")
    params = emb.embedding_tables[emb.tables[0]]
    assert params.dtype == tf.as_dtype(dtype_name)
    runs[fused] = [params.numpy().view(np.uint16)] + [
      v.numpy() for _, v in sorted(emb.slot_variables()["items"].items())
    ]
  initial = _train(dtype_name, OPTIMIZERS[opt](), steps=0)
  untouched = initial.embedding_tables[initial.tables[0]].numpy()
  assert (runs[True][0] != untouched.view(np.uint16)).any()
  for got, want in zip(runs[True], runs[False]):
    np.testing.assert_array_equal(got, want)


def _np_round(values: np.ndarray, dtype_name: str, bits: np.ndarray):
  """`narrow.round_stochastically` written again in NumPy (finite values;
  beyond the dtype's largest finite value: saturated to it)."""
  if dtype_name == "bfloat16":
    big = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    values = np.clip(values, -big, big).astype(np.float32)
    carried = values.view(np.uint32) + (bits >> np.uint64(16)).astype(np.uint32)
    kept = carried & np.uint32(0xFFFF0000)
    return kept.view(np.float32).astype(ml_dtypes.bfloat16)
  with np.errstate(over="ignore"):  # beyond float16: saturates below
    magnitude, low, high = _np_neighbours(values, dtype_name)
  draws = (bits >> np.uint64(8)).astype(np.float64) * 2.0**-24
  up = np.divide(
    magnitude.astype(np.float64) - low,
    high - low,
    out=np.zeros_like(low),
    where=high > low,
  )
  rounded = np.where(draws < up, high, low)
  rounded = np.minimum(rounded, 65504.0)  # saturates
  return np.where(values < 0, -rounded, rounded).astype(np.float16)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("from_bags", [False, True])
def test_the_fused_update_rounds_with_the_numpy_draws(dtype_name, from_bags):
  """RecsysSparseApply / RecsysBagApply on a narrow table: the float32 SGD
  step of each row, rounded with the draws of (seed, step, row, column)
  (rows beyond the largest finite value saturate, counted in the outputs;
  float16 subnormals)."""
  ops = _kernels()
  rng = np.random.default_rng(2)
  vocab, dim, seed, step = 300, 37, 91, 5
  big = float(tf.as_dtype(dtype_name).max)
  init = rng.normal(size=(vocab, dim)).astype(np.float32)
  ids = rng.choice(vocab, 120, replace=False).astype(np.int64)
  near = 65000.0 if dtype_name == "float16" else big  # the largest or near
  init[ids[0], :3] = [near, -near, near]
  init[ids[1]] *= 3e-6  # float16 subnormals (below 2**-14)
  stored = init.astype(NARROW[dtype_name])
  table = tf.Variable(stored)
  grads = rng.normal(size=(120, dim)).astype(np.float32)
  # Two beyond the largest finite value (float16: +-66000; bfloat16: its
  # largest + 1e36, a finite float32), one back within it.
  step_out = 1000.0 if dtype_name == "float16" else 1e36
  grads[0, :3] = [-step_out, step_out, step_out]
  grads[1] *= 1e-6
  attrs = optimizers.fused_attrs(E.SGD(1.0))
  args = dict(
    table=table.handle,
    slots=[],
    grads=grads,
    learning_rate=1.0,
    rounding_step=step,
    rounding_seed=seed,
    **attrs,
  )
  if from_bags:  # one entry per row, in order: its gradient unchanged
    out = ops.recsys_bag_apply(
      unique_ids=ids,
      index=np.arange(120, dtype=np.int32),
      segments=np.arange(120, dtype=np.int32),
      scale=tf.zeros([0]),
      **args,
    )
  else:
    out = ops.recsys_sparse_apply(ids=ids, **args)
  new = stored[ids].astype(np.float32) - grads
  want = stored.copy()
  want[ids] = _np_round(new, dtype_name, _np_bits(seed, step, ids, dim))
  got = table.numpy()
  assert got[ids[0], 0] == big and got[ids[0], 1] == -big
  np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
  beyond = np.abs(new.astype(np.float64)) > big
  assert int(out.saturated) == beyond.sum() == 2
  assert float(out.largest) == np.abs(new[beyond]).max()
