"""TensorCore training: optimizer math vs NumPy, replicas vs one replica."""

import numpy as np
import pytest
import tensorflow as tf

import backends
from backends import conformance
from backends import reference_optimizers as ref
from tests.backends import optimizer_cases
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
DIM = 7


def _optimizers():
  lr = tf.Variable(0.05, trainable=False)
  return {
    "sgd": lambda: E.SGD(0.1),
    "adagrad": lambda: E.Adagrad(0.1),
    "adagrad_options": optimizer_cases.adagrad_with_options,
    "adagrad_momentum": lambda: E.AdagradMomentum(
      0.1, momentum=0.9, use_nesterov=True, beta2=0.9, exponent=3.0
    ),
    "adam_lazy": lambda: E.Adam(0.05),
    "adam_dense": lambda: E.Adam(0.05, lazy_adam=False, sum_inside_sqrt=False),
    "adam_callable_lr": lambda: E.Adam(lambda: lr.read_value()),
    "ftrl": lambda: E.FTRL(
      0.1,
      l1_regularization_strength=0.01,
      l2_regularization_strength=0.02,
      beta=0.1,
    ),
  }, lr


def _config(optimizer):
  """Two features sharing a mean-combined table, a sum table, a sequence."""
  shared = E.TableConfig(23, DIM, combiner="mean", name="shared")
  other = E.TableConfig(
    11, DIM, combiner="sqrtn", name="other", optimizer=E.SGD(0.2)
  )
  config = {
    "a": E.FeatureConfig(shared),
    "b": E.FeatureConfig(shared),
    "c": E.FeatureConfig(other),
    "s": E.FeatureConfig(other, max_sequence_length=3),
  }
  return config, {"shared": optimizer, "other": other.optimizer}


def _batch(rng, batch):
  def bags(vocab, max_len):
    rows = [
      list(rng.integers(0, vocab, size=rng.integers(0, max_len + 1)))
      for _ in range(batch)
    ]
    rows[0] = [1, 1, 2] if vocab > 2 else rows[0]  # repeated ids in a bag
    return rows

  rows = {
    "a": bags(23, 4),
    "b": bags(23, 3),
    "c": bags(11, 3),
    "s": bags(11, 5),
  }
  weights = {"a": [list(rng.uniform(0.2, 2.0, len(r))) for r in rows["a"]]}
  return rows, weights


def _tensors(rows, weights):
  features = {
    k: tf.ragged.constant(v, dtype=tf.int64, ragged_rank=1)
    for k, v in rows.items()
  }
  w = {k: None for k in rows}
  w["a"] = tf.ragged.constant(weights["a"], dtype=tf.float32, ragged_rank=1)
  return features, w


def _numpy_row_grads(rows, weights, combiners, cotangents, seq_len):
  """d(sum(acts * cotangent))/d(row), summed per (table, id), in NumPy."""
  grads: dict[str, list] = {}
  for feature, bags in rows.items():
    table, combiner = combiners[feature]
    for b, bag in enumerate(bags):
      if feature == "s":
        for p, i in enumerate(bag[:seq_len]):
          grads.setdefault(table, []).append((i, cotangents[feature][b, p]))
        continue
      w = np.asarray(
        weights.get(feature, [[1.0] * len(x) for x in bags])[b], np.float64
      )
      norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[
        combiner
      ]
      for i, wi in zip(bag, w):
        grads.setdefault(table, []).append(
          (i, cotangents[feature][b] * wi / norm)
        )
  out = {}
  for table, pairs in grads.items():
    ids = np.array([i for i, _ in pairs])
    out[table] = ref.sum_duplicates(ids, np.stack([g for _, g in pairs]))
  return out


OPTIMIZER_NAMES = sorted(_optimizers()[0])

# One training step of loss = sum(acts * cotangents) (test_fused_kernels uses
# it too).
_linear_loss_step = conformance.linear_loss_step


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "tf_ops"])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_training_steps_match_numpy_reference(name, fused):
  factories, lr = _optimizers()
  config, table_opts = _config(factories[name]())
  emb = backends.TensorCoreEmbedding(
    config, table_opts["shared"], fused_kernels=fused
  )
  emb.build()
  assert (emb._kernels is not None) == fused  # pylint: disable=protected-access
  vocab = {"shared": 23, "other": 11}
  tables = {
    t.name: v.numpy().astype(np.float64)
    for t, v in emb.embedding_tables.items()
  }
  slots = {t: ref.initial_slots(table_opts[t], vocab[t], DIM) for t in vocab}
  combiners = {
    "a": ("shared", "mean"),
    "b": ("shared", "mean"),
    "c": ("other", "sqrtn"),
    "s": ("other", "sum"),
  }
  rng = np.random.default_rng(7)

  @tf.function
  def step(features, weights, cotangents):
    _linear_loss_step(emb, features, weights, cotangents)

  for i in range(3):
    lr.assign(0.05 * (i + 1))
    rows, weights = _batch(rng, 6)
    cot = {
      k: rng.normal(size=(6, 3, DIM) if k == "s" else (6, DIM)) for k in rows
    }
    step(
      *_tensors(rows, weights),
      {k: tf.constant(v, tf.float32) for k, v in cot.items()},
    )
    for table, (ids, g) in _numpy_row_grads(
      rows, weights, combiners, cot, 3
    ).items():
      tables[table], slots[table] = ref.apply(
        table_opts[table], tables[table], slots[table], ids, g
      )

  got_slots = emb.slot_variables()
  for t, var in emb.embedding_tables.items():
    np.testing.assert_allclose(
      var.numpy(), tables[t.name], rtol=2e-5, atol=2e-6, err_msg=t.name
    )
    assert sorted(got_slots[t.name]) == sorted(slots[t.name])
    for slot, value in slots[t.name].items():
      np.testing.assert_allclose(
        got_slots[t.name][slot].numpy(),
        value,
        rtol=2e-5,
        atol=2e-6,
        err_msg=f"{t.name}/{slot}",
      )


def _train(strategy, optimizer_factory, batches, num_replicas):
  """Trains on `batches` (global) split evenly over the replicas."""
  config, _ = _config(optimizer_factory())
  with strategy.scope():
    emb = backends.TensorCoreEmbedding(
      config, config["a"].table.optimizer or optimizer_factory()
    )
    emb.build()
    for var in emb.embedding_tables.values():  # same start on every run
      var.assign(tf.random.stateless_normal(var.shape, seed=[1, var.shape[0]]))

  @tf.function
  def step(features, weights, cotangents):
    strategy.run(
      lambda *args: _linear_loss_step(emb, *args),
      args=(features, weights, cotangents),
    )

  for rows, weights, cot in batches:
    per = len(rows["a"]) // num_replicas

    def shard(ctx, rows=rows, weights=weights, cot=cot, per=per):
      i = ctx.replica_id_in_sync_group
      sl = slice(i * per, (i + 1) * per)
      f, w = _tensors(
        {k: v[sl] for k, v in rows.items()}, {"a": weights["a"][sl]}
      )
      return f, w, {k: tf.constant(v[sl], tf.float32) for k, v in cot.items()}

    step(*strategy.experimental_distribute_values_from_function(shard))
  return emb


# Every optimizer on 2 replicas; 4 replicas once: the replicas combine their
# gradients before any optimizer's math, whatever the optimizer.
@pytest.mark.parametrize(
  "num_replicas,name",
  [(2, "adagrad"), (2, "adam_dense"), (2, "ftrl")]
  + [pytest.param(4, "adam_dense", marks=pytest.mark.slow)],
)
def test_replicas_match_one_replica_on_the_combined_batch(num_replicas, name):
  factories, _ = _optimizers()
  rng = np.random.default_rng(11)
  batches = []
  for _ in range(3):
    rows, weights = _batch(rng, 8)
    cot = {
      k: rng.normal(size=(8, 3, DIM) if k == "s" else (8, DIM)) for k in rows
    }
    batches.append((rows, weights, cot))
  one = _train(tf.distribute.get_strategy(), factories[name], batches, 1)
  many = _train(
    mirrored_strategy(num_replicas), factories[name], batches, num_replicas
  )
  for (t, want), got in zip(
    one.embedding_tables.items(), many.embedding_tables.values()
  ):
    copies = [v.numpy() for v in got.values]
    for copy in copies[1:]:
      # Every replica applies the same summed update: bit-identical.
      np.testing.assert_array_equal(copy, copies[0])
    np.testing.assert_allclose(
      copies[0], want.numpy(), rtol=1e-5, atol=1e-6, err_msg=t.name
    )
  for table, slots in one.slot_variables().items():
    for slot, want in slots.items():
      got = many.slot_variables()[table][slot].values[0]
      np.testing.assert_allclose(
        got.numpy(),
        want.numpy(),
        rtol=1e-5,
        atol=1e-6,
        err_msg=f"{table}/{slot}",
      )


def test_seed_example_keras_optimizer_loop_under_two_replicas():
  """TPUEmbeddingV0's documented loop: tape on the tables, Keras Adagrad."""
  strategy = mirrored_strategy(2)
  table = E.TableConfig(23, DIM, combiner="sum", name="t")
  config = {"f": E.FeatureConfig(table)}
  with strategy.scope():
    optimizer = tf.keras.optimizers.legacy.Adagrad(learning_rate=0.1)

    def slot_variable_creation_fn(table, slot_names, slot_initializers):
      return {
        slot: optimizer.add_slot(table, slot, init)
        for slot, init in zip(slot_names, slot_initializers)
      }

    embedding = backends.TensorCoreEmbedding(
      config,
      E.Adagrad(0.1, slot_variable_creation_fn=slot_variable_creation_fn),
    )
    embedding.build()
  rng = np.random.default_rng(3)
  per_replica = [
    tf.ragged.constant(
      [list(rng.integers(0, 23, rng.integers(1, 5))) for _ in range(4)],
      dtype=tf.int64,
    )
    for _ in range(2)
  ]
  features = strategy.experimental_distribute_values_from_function(
    lambda ctx: {"f": per_replica[ctx.replica_id_in_sync_group]}
  )

  @tf.function
  def training_step(features):
    def tpu_step(features):
      tables = list(embedding.embedding_tables.values())
      with tf.GradientTape() as tape:
        tape.watch(tables)
        activations = embedding(features)
        loss = tf.reduce_sum(tf.square(activations["f"] - 1.0))
      gradients = tape.gradient(loss, tables)
      optimizer.apply_gradients(list(zip(gradients, tables)))
      return loss

    losses = strategy.run(tpu_step, args=(features,))
    return strategy.reduce("SUM", losses, axis=None)

  losses = [float(training_step(features)) for _ in range(20)]
  assert losses[-1] < 0.5 * losses[0]
  copies = [v.numpy() for v in embedding.embedding_tables[table].values]
  # Every replica applies the same reduced gradient: bit-identical.
  np.testing.assert_array_equal(copies[0], copies[1])
  # Keras's Adagrad (epsilon 1e-7) on the summed gradient: the slot is Keras's.
  assert embedding.slot_variables()["t"]["accumulators"] is optimizer.get_slot(
    embedding.embedding_tables[table], "accumulators"
  )


def test_apply_gradients_without_training_lookup_is_an_error():
  table = E.TableConfig(23, DIM, name="t")
  emb = backends.TensorCoreEmbedding({"f": E.FeatureConfig(table)}, E.SGD(0.1))
  emb({"f": tf.constant([1, 2])})
  with pytest.raises(RuntimeError, match="lookup"):
    emb.apply_gradients({"f": tf.ones([2, DIM])})


def test_unused_feature_gradient_is_none_and_rows_untouched():
  table = E.TableConfig(23, DIM, combiner="sum", name="t")
  config = {"f": E.FeatureConfig(table), "g": E.FeatureConfig(table)}
  emb = backends.TensorCoreEmbedding(config, E.SGD(1.0))
  before = emb.embedding_tables[table].numpy()
  with tf.GradientTape() as tape:
    acts = emb(
      {"f": tf.constant([1, 2]), "g": tf.constant([5, 6])}, training=True
    )
    loss = tf.reduce_sum(acts["f"])
  emb.apply_gradients(tape.gradient(loss, acts))
  after = emb.embedding_tables[table].numpy()
  np.testing.assert_allclose(after[[1, 2]], before[[1, 2]] - 1.0, rtol=1e-6)
  untouched = [i for i in range(23) if i not in (1, 2)]
  np.testing.assert_array_equal(after[untouched], before[untouched])


def _loop_run(strategy, per_replica_batch, steps=3):
  """Trains `steps` steps inside ONE tf.function loop on padded bags."""
  table = E.TableConfig(23, DIM, combiner="mean", name="t")
  config = {"f": E.FeatureConfig(table)}
  with strategy.scope():
    emb = backends.TensorCoreEmbedding(config, E.Adagrad(0.1), bag_widths=4)
    emb.build()
    emb.embedding_tables[table].assign(
      tf.reshape(tf.range(23 * DIM, dtype=tf.float32) / 100.0, [23, DIM])
    )
  rng = np.random.default_rng(2)
  rows = [
    list(rng.integers(0, 23, rng.integers(1, 6))) for _ in range(8 * steps)
  ]

  def dataset_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices(
      tf.ragged.constant(rows, dtype=tf.int64)
    ).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ds = ds.batch(ctx.get_per_replica_batch_size(8), drop_remainder=True)
    return ds.map(lambda ids: emb.preprocess({"f": ids})[0])

  iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

  @tf.function
  def loop(iterator, n):
    def replica_step(features):
      with tf.GradientTape() as tape:
        acts = emb.lookup(features, training=True)
        tape.watch(acts)
        loss = tf.reduce_sum(acts["f"] * acts["f"])
      emb.apply_gradients(tape.gradient(loss, acts))

    for _ in tf.range(n):
      strategy.run(replica_step, args=(next(iterator),))

  loop(iterator, tf.constant(steps))
  return emb, table


def test_several_steps_in_one_loop_under_two_replicas():
  """Static bag widths give the replicas' exchange a fixed shape per step."""
  one, table = _loop_run(tf.distribute.get_strategy(), 8)
  two, table2 = _loop_run(mirrored_strategy(2), 4)
  np.testing.assert_allclose(
    two.embedding_tables[table2].values[0].numpy(),
    one.embedding_tables[table].numpy(),
    rtol=1e-5,
    atol=1e-6,
  )
