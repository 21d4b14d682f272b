"""tensorcore's compiled path (XLA, as a TPU runs it) against the uncompiled
one.

The proxy for a TPU here: `tf.function(jit_compile=True)` on the CPU, and an
HLO with no dynamic dimension. References: the uncompiled step (the generic
path, itself tested against NumPy), one replica against several.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import inputs, static_bags
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding

OPTIMIZERS = {
  "sgd": lambda: E.SGD(0.1, clipvalue=0.5),
  "adagrad": lambda: E.Adagrad(0.1, weight_decay_factor=0.01),
  "adagrad_momentum": lambda: E.AdagradMomentum(
    0.1, momentum=0.9, use_nesterov=True
  ),
  "lazy_adam": lambda: E.Adam(0.01, clip_weight_min=-0.5, clip_weight_max=0.5),
  "dense_adam": lambda: E.Adam(0.01, lazy_adam=False),
  "ftrl": lambda: E.FTRL(
    0.1, l1_regularization_strength=0.01, multiply_linear_by_learning_rate=True
  ),
}

BATCH = 6


# Every optimizer in two compiled programs: one per table (compiling is the
# slow part of these tests).
TABLE_OPTIMIZERS = {
  "a": ("sgd", "adagrad", "ftrl"),
  "b": ("lazy_adam", "adagrad_momentum", "dense_adam"),
}


def mixed_config(optimizers=(None, None, None)):
  """Shared mean table with weights, sqrtn, a sequence, dense ids, sum."""
  init = lambda seed: tf.keras.initializers.RandomUniform(-1, 1, seed=seed)
  opt = [OPTIMIZERS[o]() if o else None for o in optimizers]
  shared = E.TableConfig(
    23, 7, name="shared", combiner="mean", initializer=init(1), optimizer=opt[0]
  )
  sq = E.TableConfig(
    31, 7, name="sq", combiner="sqrtn", initializer=init(2), optimizer=opt[1]
  )
  seq = E.TableConfig(
    17, 5, name="seq", combiner="sum", initializer=init(3), optimizer=opt[2]
  )
  return {
    "f1": E.FeatureConfig(shared),
    "f2": E.FeatureConfig(shared),
    "f3": E.FeatureConfig(sq),
    "s": E.FeatureConfig(seq, max_sequence_length=3),
    "d": E.FeatureConfig(seq),
  }


WIDTHS = {"f1": 3, "f2": 2, "f3": 4}


def make_batches(num, batch=BATCH, seed=0):
  """Ragged batches with repeated ids, empty bags and bags longer than the
  width."""
  rng = np.random.default_rng(seed)

  def ragged(vocab, longest, values=None):
    lengths = rng.integers(0, longest + 1, batch)
    vals = rng.integers(0, vocab, lengths.sum()) if values is None else values
    return tf.RaggedTensor.from_row_lengths(vals, lengths)

  out = []
  for _ in range(num):
    f = {
      "f1": ragged(5, 4),
      "f2": ragged(23, 2),
      "f3": ragged(31, 5),
      "s": ragged(17, 4),
      "d": tf.constant(rng.integers(0, 4, batch)),
    }
    w3 = tf.RaggedTensor.from_row_lengths(
      rng.uniform(0.1, 2.0, f["f3"].values.shape[0]).astype(np.float32),
      f["f3"].row_lengths(),
    )
    out.append((f, {"f1": None, "f2": None, "f3": w3, "s": None, "d": None}))
  return out


HEAD = (
  np.random.default_rng(1)
  .normal(size=(7 + 7 + 7 + 15 + 5, 1))
  .astype(np.float32)
)


def loss_fn(acts):
  x = tf.concat(
    [
      acts["f1"],
      acts["f2"],
      acts["f3"],
      tf.reshape(acts["s"], [-1, 15]),
      acts["d"],
    ],
    1,
  )
  return tf.reduce_sum(tf.square(x @ HEAD - 1.0))


def train_step(emb):
  def step(features, weights):
    with tf.GradientTape() as tape:
      acts = emb(features, weights, training=True)
      tape.watch(acts)
      loss = loss_fn(acts)
    emb.apply_gradients(tape.gradient(loss, acts))
    return loss

  return step


def table_state(emb):
  """Every table and slot by "<table>/<slot>" ("<table>/parameters")."""
  out = {}
  for table, var in emb.embedding_tables.items():
    out[f"{table.name}/parameters"] = tf.convert_to_tensor(var).numpy()
  for name, slots in emb.slot_variables().items():
    for key, var in slots.items():
      out[f"{name}/{key}"] = tf.convert_to_tensor(var).numpy()
  return out


def assert_close(want, got, tol=1e-6):
  """Same keys, values within `tol` relative (of the array's scale: sums run
  in another order)."""
  assert sorted(want) == sorted(got)
  for key in want:
    scale = max(1.0, float(np.abs(want[key]).max()))
    np.testing.assert_allclose(
      got[key], want[key], rtol=tol, atol=tol * scale, err_msg=key
    )


def run(
  optimizer, jit_compile, batches, table_optimizers=(None,) * 3, **options
):
  emb = TensorCoreEmbedding(
    mixed_config(table_optimizers), optimizer, bag_widths=WIDTHS, **options
  )
  emb.build()
  step = tf.function(train_step(emb), jit_compile=jit_compile)
  for features, weights in batches:
    step(*emb.preprocess(features, weights))
  return emb, step


@pytest.mark.parametrize("group", sorted(TABLE_OPTIMIZERS))
def test_compiled_step_equals_uncompiled(group):
  """Every optimizer, combiner, weights, a shared table, a sequence feature."""
  batches = make_batches(3)
  want, _ = run(None, False, batches, TABLE_OPTIMIZERS[group])
  got, step = run(None, True, batches, TABLE_OPTIMIZERS[group])
  assert_close(table_state(want), table_state(got))
  hlo = step.experimental_get_compiler_ir(*got.preprocess(*batches[0]))(
    stage="hlo"
  )
  assert "<=" not in hlo  # no dynamic (bounded) dimension anywhere


def test_static_path_uncompiled_equals_compiled():
  """The static path gives the same numbers with or without XLA."""
  batches = make_batches(3, seed=4)
  want, _ = run(E.Adagrad(0.1), True, batches)
  got, _ = run(E.Adagrad(0.1), False, batches, static_shapes=True)
  assert_close(table_state(want), table_state(got))


def test_tape_on_tables_gets_fixed_size_indexed_slices():
  emb = TensorCoreEmbedding(
    mixed_config(), E.SGD(0.1), bag_widths=WIDTHS, static_shapes=True
  )
  features, weights = emb.preprocess(*make_batches(1)[0])
  names = [t.name for t in emb.embedding_tables]
  tables = list(emb.embedding_tables.values())
  with tf.GradientTape() as tape:
    loss = loss_fn(emb(features, weights))
  grads = tape.gradient(loss, tables)
  # shared: f1 (3 wide) + f2 (2 wide) per row; the static capacity.
  assert grads[names.index("shared")].indices.shape == [BATCH * (3 + 2)]
  # The summed IndexedSlices equal the generic path's gradient.
  ref = TensorCoreEmbedding(mixed_config(), E.SGD(0.1), bag_widths=WIDTHS)
  ref_tables = list(ref.embedding_tables.values())
  with tf.GradientTape() as tape:
    ref_loss = loss_fn(ref(features, weights))
  ref_grads = tape.gradient(ref_loss, ref_tables)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(
      tf.convert_to_tensor(g), tf.convert_to_tensor(r), rtol=1e-6, atol=1e-6
    )


@pytest.mark.slow
def test_two_replicas_equal_one_replica_compiled():
  """2 mirrored replicas on the static path == 1 compiled replica, combined
  batch.

  XLA cannot compile collectives on CPU replicas, so the 2-replica step runs
  the static path uncompiled: the numbers of a compiled multi-replica step.
  """
  strategy = mirrored_strategy(2)
  batches = make_batches(3, batch=2 * BATCH, seed=7)
  want, _ = run(E.Adagrad(0.1), True, batches)
  with strategy.scope():
    emb = TensorCoreEmbedding(
      mixed_config(),
      E.Adagrad(0.1),
      strategy=strategy,
      bag_widths=WIDTHS,
      static_shapes=True,
    )
    emb.build()
  step = train_step(emb)

  @tf.function
  def replicated(features, weights):
    def fn(ctx):
      lo, hi = (
        ctx.replica_id_in_sync_group * BATCH,
        (ctx.replica_id_in_sync_group + 1) * BATCH,
      )
      cut = lambda t: tf.nest.map_structure(lambda x: x[lo:hi], t)
      f = {
        k: (
          inputs.PaddedBags(*(x[lo:hi] for x in v))
          if isinstance(v, inputs.PaddedBags)
          else cut(v)
        )
        for k, v in features.items()
      }
      return f

    dist = strategy.experimental_distribute_values_from_function(fn)
    # The loss is a sum over examples: the replicas' summed gradients equal
    # one replica's on the combined batch.
    strategy.run(step, args=(dist, None))

  for features, weights in batches:
    f, w = emb.preprocess(features, weights)
    assert w is None  # every weighted feature is padded
    replicated(f, w)
  assert_close(table_state(want), table_state(emb))
  for table, variable in emb.embedding_tables.items():
    local = strategy.experimental_local_results(variable)
    # Every replica applies the same summed update: bit-identical.
    np.testing.assert_array_equal(
      local[0].numpy(), local[1].numpy(), err_msg=table.name
    )


def test_compiled_step_refuses_bad_ids_without_reading_them():
  emb = TensorCoreEmbedding(mixed_config(), E.SGD(0.1), bag_widths=WIDTHS)
  emb.build()
  features, weights = make_batches(1)[0]
  features = dict(features)
  features["d"] = tf.constant([1, 2, 17, 3, 0, 1], tf.int64)  # 17 >= vocab 17
  before = emb.embedding_tables[emb.tables[2]].numpy()
  step = tf.function(train_step(emb), jit_compile=True)
  step(*emb.preprocess(features, weights))
  with pytest.raises(
    inputs.InvalidInputError,
    match=r"feature 'd' \(table 'seq'.*id 17 at batch row 2",
  ):
    emb.raise_for_invalid_inputs()
  emb.raise_for_invalid_inputs()  # reported once
  after = emb.embedding_tables[emb.tables[2]].numpy()
  np.testing.assert_array_equal(after[16], before[16])  # no clamped read/write


def test_uncompiled_static_path_raises_at_once():
  emb = TensorCoreEmbedding(
    mixed_config(), E.SGD(0.1), bag_widths=WIDTHS, static_shapes=True
  )
  features, weights = make_batches(1)[0]
  features = dict(features, d=tf.constant([1, 2, -1, 3, 0, 1], tf.int64))
  with pytest.raises(
    inputs.InvalidInputError, match="'d'.*id -1 at batch row 2"
  ):
    emb(*emb.preprocess(features, weights))


def test_sparse_input_without_static_batch_fails_at_trace_time():
  table = E.TableConfig(11, 3, name="t")
  emb = TensorCoreEmbedding({"tags": E.FeatureConfig(table)}, E.SGD(0.1))
  emb.build()
  spec = tf.SparseTensorSpec([None, None], tf.int64)
  step = tf.function(
    lambda sp: emb({"tags": sp}), jit_compile=True, input_signature=[spec]
  )
  with pytest.raises(
    static_bags.StaticShapeError, match="feature 'tags'.*bag_widths"
  ):
    step.get_concrete_function()


def test_dynamic_exchange_between_replicas_fails_at_trace_time():
  strategy = mirrored_strategy(2)
  table = E.TableConfig(11, 3, name="t")
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"tags": E.FeatureConfig(table)},
      E.SGD(0.1),
      strategy=strategy,
      static_shapes=True,
    )
    emb.build()

  def step(rt):
    with tf.GradientTape() as tape:
      acts = emb({"tags": rt}, training=True)
      tape.watch(acts)
      loss = tf.reduce_sum(acts["tags"])
    emb.apply_gradients(tape.gradient(loss, acts))

  rt = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
  with pytest.raises(
    static_bags.StaticShapeError, match="table 't'.*'tags'.*bag_widths"
  ):
    tf.function(lambda x: strategy.run(step, args=(x,)))(rt)


@pytest.mark.parametrize("how", ["marking", "sorting"])
@pytest.mark.parametrize(
  "valid",
  [[True, True, False, True, False], [False, False, False, False, False]],
)
def test_dedup_matches_numpy(valid, how, monkeypatch):
  if how == "sorting":  # the path of tables much larger than a step's ids
    monkeypatch.setattr(static_bags, "_MARK_RATIO", 0)
  ids = tf.constant([7, 3, 7, 9, 3], tf.int64)
  dd = static_bags.dedup(ids, tf.constant(valid), 10)
  real = sorted({int(i) for i, v in zip(ids.numpy(), valid) if v})
  k = int(dd.num_unique)
  assert dd.ids.numpy()[:k].tolist() == real
  # Unused slots repeat slot 0 (row 0 when nothing is valid).
  assert set(dd.ids.numpy()[k:].tolist()) <= {real[0] if real else 0}
  for i, v in enumerate(valid):
    if v:
      assert dd.ids.numpy()[dd.index.numpy()[i]] == ids.numpy()[i]
