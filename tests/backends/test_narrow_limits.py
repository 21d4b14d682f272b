"""A narrow table at its limits: saturated and counted, in training and in
restores (`backends.storage.narrow`, issue 55 item 4).

References: NumPy. Training runs SGD (learning rate 1) on rows and
gradients that are multiples of 32 below 2^24, so every float32 value is
exact and exact in float16 within its range: the table after each step is
`clip(old - g, -65504, 65504)` in NumPy, the count the values beyond
65504, whatever engine (fused kernels or TF ops), replica count or
placement ran it. Restores: NumPy's float16 of the float32 checkpoint with
the values beyond +-65504 replaced by +-65504.
"""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from backends import checkpoint as checkpoint_lib
from backends import reference_optimizers as ref
from backends.layout import TableLayout
from backends.storage import narrow, row_sharded_checkpoint
from backends.tensorcore import kernels
from backends.tensorcore.backend import TensorCoreEmbedding
from recsys import layers, planning
from recsys._keras import keras
from tests.backends.replica_steps import strategy_for, train_split
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
VOCAB, DIM, HALF_MAX = 12, 4, 65504.0
KEY = "embedding/items/.ATTRIBUTES/VARIABLE_VALUE"


# -- the policy's functions ----------------------------------------------------


def _np_saturate(x: np.ndarray, limit: float) -> np.ndarray:
  beyond = np.isfinite(x) & (np.abs(x) > limit)
  return np.where(beyond, np.sign(x) * limit, x)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_a_narrow_cast_saturates_beyond_the_range_and_keeps_inf_and_nan(
  dtype_name,
):
  dtype = tf.as_dtype(dtype_name)
  limit = float(dtype.max)
  x = np.array(
    [1.5, -3.0, 65504, 65519, 65520, 7e4, -1e6, 3.3e38, 3.4e38, -3.4e38]
    + [np.inf, -np.inf, np.nan],
    np.float32,
  )
  got = narrow.cast(tf.constant(x), dtype)
  np_dtype = np.float16 if dtype_name == "float16" else ml_dtypes.bfloat16
  want = _np_saturate(x.astype(np.float64), limit).astype(np.float32)
  np.testing.assert_array_equal(
    got.numpy().astype(np.float32), want.astype(np_dtype).astype(np.float32)
  )
  assert np.isfinite(got.numpy()[:-3].astype(np.float32)).all()  # never inf
  beyond = np.isfinite(x) & (np.abs(x.astype(np.float64)) > limit)
  count, largest = narrow.saturated(tf.constant(x), dtype)
  assert int(count) == beyond.sum() > 0
  assert float(largest) == np.abs(x[beyond]).max()
  assert narrow.saturated_in(x, dtype) == (beyond.sum(), float(largest))


def test_bfloat16_rounding_saturates_where_a_carry_reached_inf():
  """Finite float32 values above bfloat16's largest (3.3895e38) round to
  it, never to inf (the carry of a draw would reach inf)."""
  big = float(tf.bfloat16.max)
  x = np.array([[3.39e38, -3.4e38, big, 1.0 + 2.0**-9]], np.float32)
  bits = tf.constant(np.full((1, 4), 0xFFFFFFFF, np.uint32))  # always up
  got = narrow.round_stochastically(tf.constant(x), tf.bfloat16, bits)
  want = [big, -big, big, 1.0 + 2.0**-7]
  np.testing.assert_array_equal(got.numpy().astype(np.float32)[0], want)


# -- training ------------------------------------------------------------------


def _initial():
  """Rows that are multiples of 32 up to 65504 (exact in float16)."""
  rng = np.random.default_rng(3)
  rows = rng.integers(-2047, 2048, size=(VOCAB, DIM)) * 32.0
  rows[:4] = np.sign(rows[:4]) * rng.integers(2000, 2048, (4, DIM)) * 32.0
  return rows


def _batches(steps=3):
  """Bags of 3 ids; activation gradients multiples of 32 (so exact sums)."""
  rng = np.random.default_rng(4)
  return [
    (
      rng.integers(0, VOCAB, size=(8, 3)).astype(np.int64),
      (rng.integers(-60, 61, size=(8, DIM)) * 32.0).astype(np.float32),
    )
    for _ in range(steps)
  ]


def _reference(steps=3):
  """NumPy: the table, the values saturated and their largest magnitude."""
  table, count, largest = _initial(), 0, 0.0
  for ids, c in _batches(steps):
    grads = np.repeat(c, ids.shape[1], axis=0).astype(np.float64)
    unique, summed = ref.sum_duplicates(ids.reshape(-1), grads)
    new = table[unique] - summed
    beyond = np.abs(new) > HALF_MAX
    count += int(beyond.sum())
    largest = max([largest, *np.abs(new[beyond])])
    table[unique] = np.clip(new, -HALF_MAX, HALF_MAX)
  return table, count, largest


#: A float16 table row-sharded over the replicas, its rows contiguous.
SHARDED_F16 = TableLayout("row_sharded", "float16", row_layout="contiguous")


def _train(replicas=1, jit=False, **options):
  """3 SGD steps of a float16 table, each replica its slice of a batch."""
  strategy = strategy_for(replicas)
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {
        "f": E.FeatureConfig(
          E.TableConfig(VOCAB, DIM, name="items", combiner="sum")
        )
      },
      E.SGD(1.0),
      strategy,
      **{"layouts": TableLayout(dtype="float16"), "bag_widths": 3, **options},
    )
    emb.build()
  emb.embedding_tables[emb.tables[0]].assign(_initial().astype(np.float16))
  train_split(emb, strategy, _batches(), replicas, jit_compile=jit)
  return emb


@pytest.mark.parametrize(
  "replicas,jit,options",
  [
    (1, False, {}),  # the fused kernels where built
    (1, False, {"fused_kernels": False}),  # the TF ops
    (1, True, {}),  # compiled: static steps, padded with repeats of slot 0
    (2, False, {}),
    (2, False, {"layouts": SHARDED_F16}),
    (2, False, {"layouts": SHARDED_F16, "static_shapes": True}),
  ],
  ids=["fused", "tf_ops", "compiled", "2", "2_sharded", "2_sharded_static"],
)
def test_a_float16_table_saturates_and_counts_as_numpy(
  replicas, jit, options, caplog
):
  want, count, largest = _reference()
  assert count > 0  # the steps do push values beyond 65504
  emb = _train(replicas, jit, **options)
  if options.get("fused_kernels") is False:
    assert emb.engine_names[0] == "tf_ops"
  elif kernels.load() is not None:
    assert emb.engine_names[0] == "fused"
  table = emb.embedding_tables[emb.tables[0]]
  got = tf.convert_to_tensor(table).numpy()
  assert got.dtype == np.float16
  np.testing.assert_array_equal(got.astype(np.float64), want)
  with caplog.at_level("WARNING", "recsys.backends"):
    assert emb.narrow_counts() == {"items": count}
    emb.narrow_counts()
  storage = emb._storages["items"]  # pylint: disable=protected-access
  assert storage.saturated().largest == largest
  warned = [r.getMessage() for r in caplog.records if "saturated" in r.message]
  assert len(warned) == 1, warned  # the first time only
  assert f"table 'items' (float16): {count} value(s)" in warned[0]


def test_float32_tables_count_nothing():
  emb = TensorCoreEmbedding(
    {
      "f": E.FeatureConfig(
        E.TableConfig(VOCAB, DIM, name="items", combiner="sum")
      )
    },
    E.SGD(1.0),
    bag_widths=3,
  )
  emb.build()
  assert emb.narrow_counts() == {}


# -- restores ------------------------------------------------------------------

WIDE = np.full((VOCAB, DIM), 1.25, np.float32)
WIDE[1, 0], WIDE[2, 1], WIDE[3, 2], WIDE[4, 3] = 69000, -1e6, np.inf, 65510


def _backend(dtype_name, strategy=None, sharded=False, **options):
  return TensorCoreEmbedding(
    {
      "f": E.FeatureConfig(
        E.TableConfig(VOCAB, DIM, name="items", combiner="sum")
      )
    },
    E.Adagrad(0.1),
    strategy,
    layouts=TableLayout(
      "row_sharded" if sharded else "replicated",
      dtype_name,
      row_layout="contiguous" if sharded else None,
    ),
    **options,
  )


def _saved(tmp_path, values=WIDE):
  source = _backend("float32")
  source.build()
  source.embedding_tables[source.tables[0]].assign(values)
  return tf.train.Checkpoint(embedding=source).save(str(tmp_path / "ckpt"))


def _rows(emb):
  return tf.convert_to_tensor(emb.embedding_tables[emb.tables[0]]).numpy()


def _saturated_wide():
  return _np_saturate(WIDE.astype(np.float64), HALF_MAX).astype(np.float16)


REFUSAL = (
  r"table 'items': checkpoint .* holds 3 value\(s\) beyond float16's range "
  r"\(\+-65504\), the largest 1e\+06.*Nothing was restored.*"
  r"saturate_restores=True"
)


@pytest.mark.parametrize("built", [True, False])
def test_a_restore_beyond_float16s_range_is_refused_before_anything(
  tmp_path, built
):
  """69000, -1e6 and 65510 are beyond +-65504 (inf is not counted): the
  restore names the table, the count and the largest, and assigns
  nothing (table and slots keep their values)."""
  path = _saved(tmp_path)
  emb = _backend("float16")
  if built:
    emb.build()
  with pytest.raises(narrow.NarrowRangeError, match=REFUSAL):
    checkpoint_lib.restore(emb, path)
  fresh = _backend("float16")
  fresh.build()
  np.testing.assert_array_equal(_rows(emb), _rows(fresh))
  acc = emb.slot_variables()["items"]["accumulators"].numpy()
  np.testing.assert_array_equal(acc, np.full_like(acc, 0.1))


@pytest.mark.parametrize("how", ["argument", "backend_option"])
@pytest.mark.parametrize("built", [True, False])
def test_a_restore_asked_to_saturate_saturates_and_warns(
  tmp_path, caplog, how, built
):
  path = _saved(tmp_path)
  option = {"saturate_restores": True} if how == "backend_option" else {}
  emb = _backend("float16", **option)
  if built:
    emb.build()
  with caplog.at_level("WARNING", "recsys.backends"):
    checkpoint_lib.restore(
      emb, path, saturate=True if how == "argument" else None
    )
  got = _rows(emb)
  np.testing.assert_array_equal(got, _saturated_wide())
  assert np.isinf(got[3, 2])  # inf stays inf (the health checks see it)
  assert "saturated 3 value(s) beyond float16's range" in caplog.text


def test_values_within_float16s_range_restore_rounded_to_nearest(tmp_path):
  values = WIDE.copy()
  values[[1, 2, 3, 4]] = [[1e-3, -7.77, 65504, -65500]] * 4
  path = _saved(tmp_path, values)
  emb = _backend("float16")
  checkpoint_lib.restore(emb, path)
  np.testing.assert_array_equal(_rows(emb), values.astype(np.float16))


def test_bfloat16_takes_what_float16_refuses(tmp_path):
  path = _saved(tmp_path)
  emb = _backend("bfloat16")
  checkpoint_lib.restore(emb, path)
  np.testing.assert_array_equal(_rows(emb), WIDE.astype(ml_dtypes.bfloat16))


def test_tfs_own_restore_on_creation_refuses_or_saturates(tmp_path):
  """A user's `tf.train.Checkpoint(...).restore` before `build()` (the
  values come in as the variables are made) refuses as well, or
  saturates with the backend option."""
  path = _saved(tmp_path)
  emb = _backend("float16")
  tf.train.Checkpoint(embedding=emb).restore(path).expect_partial()
  with pytest.raises(
    narrow.NarrowRangeError, match="restored as the table is created"
  ):
    emb.build()
  emb = _backend("float16", saturate_restores=True)
  tf.train.Checkpoint(embedding=emb).restore(path).expect_partial()
  emb.build()
  np.testing.assert_array_equal(_rows(emb), _saturated_wide())


def test_the_row_sharded_sliced_restore_refuses_or_saturates(tmp_path):
  """Two contiguous float32 shards saved by row slices, restored into two
  float16 shards and into a replicated float16 table (read whole)."""
  strategy = mirrored_strategy(2)
  sharded = {"sharded": True}
  with strategy.scope():
    source = _backend("float32", strategy, **sharded)
    source.build()
  source.embedding_tables[source.tables[0]].assign(WIDE)
  root = tf.train.Checkpoint(embedding=source)
  path = row_sharded_checkpoint.save(
    root,
    strategy,
    lambda options: root.save(str(tmp_path / "ckpt"), options=options),
    chief=True,
  )
  assert KEY in row_sharded_checkpoint.sliced_keys(path)
  for target_strategy, options in ((strategy, sharded), (None, {})):
    scope = (target_strategy or tf.distribute.get_strategy()).scope()
    with scope:
      emb = _backend("float16", target_strategy, **options)
      emb.build()
    before = _rows(emb)
    with pytest.raises(narrow.NarrowRangeError, match=REFUSAL):
      checkpoint_lib.restore(emb, path)
    np.testing.assert_array_equal(_rows(emb), before)
    checkpoint_lib.restore(emb, path, saturate=True)
    np.testing.assert_array_equal(_rows(emb), _saturated_wide())


# -- the Keras layer's load_weights ------------------------------------------


def _model(dtype_name, **options):
  table = E.TableConfig(VOCAB, DIM, name="items")
  emb = layers.Embedding(
    {"f": E.FeatureConfig(table)},
    E.Adagrad(0.1),
    backend="tensorcore",
    backend_options=options,
    placement=planning.EmbeddingPlacement(table_dtype=dtype_name),
  )
  inputs = {"f": keras.Input([], dtype=tf.int64, name="f")}
  model = keras.Model(inputs, keras.layers.Dense(1)(emb(inputs)["f"]))
  return emb, model


def _layer_rows(emb):
  return emb.embedding.embedding_tables[emb.embedding.tables[0]].numpy()


def _weights(tmp_path, dtype_name, values):
  emb, model = _model(dtype_name)
  emb.embedding.embedding_tables[emb.embedding.tables[0]].assign(values)
  path = str(tmp_path / f"weights_{dtype_name}")
  model.save_weights(path)
  return path, model


def test_load_weights_casts_across_table_dtypes_as_the_trainer(tmp_path):
  """float32 weights into a float16 layer: rounded to nearest (values
  within range); float16 weights into a float32 layer: exact; the dense
  layer's weights with them."""
  values = np.random.default_rng(0).normal(size=(VOCAB, DIM))
  wide_path, wide = _weights(tmp_path, "float32", values.astype(np.float32))
  emb, model = _model("float16")
  model.load_weights(wide_path).assert_existing_objects_matched()
  np.testing.assert_array_equal(
    _layer_rows(emb), values.astype(np.float32).astype(np.float16)
  )
  np.testing.assert_array_equal(
    model.layers[-1].kernel.numpy(), wide.layers[-1].kernel.numpy()
  )
  half_path, _ = _weights(tmp_path, "float16", values.astype(np.float16))
  emb, model = _model("float32")
  model.load_weights(half_path).assert_existing_objects_matched()
  np.testing.assert_array_equal(
    _layer_rows(emb), values.astype(np.float16).astype(np.float32)
  )
  # The cast is for that restore only: the layer saves its own dtype.
  model.save_weights(str(tmp_path / "again"))
  reader = tf.train.load_checkpoint(str(tmp_path / "again"))
  dtypes = {
    k: d for k, d in reader.get_variable_to_dtype_map().items() if "items" in k
  }
  assert set(dtypes.values()) == {tf.float32}, dtypes


def test_load_weights_beyond_float16s_range_is_refused_or_saturated(tmp_path):
  path, _ = _weights(tmp_path, "float32", WIDE)
  emb, model = _model("float16")
  before = _layer_rows(emb)
  kernel = model.layers[-1].kernel.numpy()
  with pytest.raises(narrow.NarrowRangeError, match=REFUSAL):
    model.load_weights(path)
  np.testing.assert_array_equal(_layer_rows(emb), before)
  np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), kernel)
  emb, model = _model("float16", saturate_restores=True)
  model.load_weights(path).assert_existing_objects_matched()
  np.testing.assert_array_equal(_layer_rows(emb), _saturated_wide())
