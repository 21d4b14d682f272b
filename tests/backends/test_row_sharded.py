"""Row-sharded tables over the replicas against replicated ones on 1 replica.

Reference: the same steps on one replica with replicated tables and the
global batch (itself tested against NumPy by the conformance suite), for
every optimizer and combiner, weights, sequence features and a shared
table, on 2 and 4 logical CPU replicas, uncompiled and on the static path;
and NumPy for the rows a replica gets from other owners.
"""

import numpy as np
import pytest
import tensorflow as tf

from backends import base as backends_base
from backends import checkpoint as checkpoint_lib
from backends.layout import TableLayout
from backends.mid_level.serving import ServingEmbedding
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.backends import test_compiled_path as compiled
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
BATCH = 12  # global: 6 or 3 examples per replica


def every_case_config():
  """Every optimizer on its own table; every combiner; weights; a sequence;
  a table shared by two features; dense ids."""
  init = lambda seed: tf.keras.initializers.RandomUniform(-1, 1, seed=seed)  # noqa: E731

  def table(name, vocab, dim, combiner, optimizer, seed):
    return E.TableConfig(
      vocab,
      dim,
      name=name,
      combiner=combiner,
      initializer=init(seed),
      optimizer=compiled.OPTIMIZERS[optimizer](),
    )

  shared = table("shared", 23, 7, "mean", "sgd", 1)
  return {
    "f1": E.FeatureConfig(shared),
    "f2": E.FeatureConfig(shared),
    "f3": E.FeatureConfig(table("sq", 31, 7, "sqrtn", "adagrad", 2)),
    "s": E.FeatureConfig(
      table("seq", 17, 5, "sum", "ftrl", 3), max_sequence_length=3
    ),
    "d": E.FeatureConfig(table("dense", 13, 5, "sum", "lazy_adam", 4)),
    "m": E.FeatureConfig(table("mom", 11, 3, "mean", "adagrad_momentum", 5)),
    "a": E.FeatureConfig(table("adam", 19, 3, "sqrtn", "dense_adam", 6)),
  }


WIDTHS = {"f1": 3, "f2": 2, "f3": 4, "m": 2, "a": 3}


def batches(num=2, seed=0):
  """Global batches: `test_compiled_path`'s (ragged bags, empty, repeated and
  too long, weights, dense ids) and bags for the two more tables."""
  rng = np.random.default_rng(seed + 100)
  out = []
  for features, weights in compiled.make_batches(num, BATCH, seed):
    for name, vocab in (("m", 11), ("a", 19)):
      lengths = rng.integers(0, 4, BATCH)
      features[name] = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, vocab, lengths.sum()), lengths
      )
      weights[name] = None
    out.append((features, weights))
  return out


HEAD = np.random.default_rng(1).normal(size=(7 * 3 + 15 + 5 + 3 + 3, 1))


def loss_fn(acts):
  x = tf.concat(
    [acts["f1"], acts["f2"], acts["f3"], tf.reshape(acts["s"], [-1, 15])]
    + [acts["d"], acts["m"], acts["a"]],
    1,
  )
  return tf.reduce_sum(tf.square(x @ tf.constant(HEAD, tf.float32) - 1.0))


state = compiled.table_state  # every table and slot, "<table>/<slot>"


def train(emb, strategy, data, loss_of=loss_fn, batch=BATCH):
  """Steps of `loss_of` on `strategy`, each replica its slice of a batch;
  returns the step's `tf.function`."""
  replicas = strategy.num_replicas_in_sync
  per_replica = batch // replicas

  def step(features):
    with tf.GradientTape() as tape:
      acts = emb(features, training=True)
      tape.watch(acts)
      loss = loss_of(acts)
    emb.apply_gradients(tape.gradient(loss, acts))

  @tf.function
  def run(features):
    def local(ctx):
      i = ctx.replica_id_in_sync_group
      return tf.nest.map_structure(
        lambda x: x[i * per_replica : (i + 1) * per_replica], features
      )

    strategy.run(
      step, args=(strategy.experimental_distribute_values_from_function(local),)
    )

  for features, weights in data:
    padded, no_weights = emb.preprocess(features, weights)
    assert no_weights is None  # every weighted feature is padded
    run(padded)
  return run


def make(strategy, **options):
  with strategy.scope():
    emb = TensorCoreEmbedding(
      every_case_config(), E.SGD(0.1), strategy, bag_widths=WIDTHS, **options
    )
    emb.build()
  return emb


_TRAINED: dict = {}


def trained(replicas: int, static: bool, **options):
  """The backend after `batches()` on `replicas` (cached per module)."""
  key = (replicas, static, tuple(sorted(options.items())))
  if key not in _TRAINED:
    strategy = (
      mirrored_strategy(replicas)
      if replicas > 1
      else tf.distribute.get_strategy()
    )
    emb = make(strategy, static_shapes=static, **options)
    train(emb, strategy, batches())
    _TRAINED[key] = emb
  return _TRAINED[key]


@pytest.mark.parametrize(
  "replicas,static,layout",
  [
    pytest.param(2, False, "strided", id="2-dynamic"),
    pytest.param(2, True, "contiguous", id="2-static", marks=pytest.mark.slow),
    pytest.param(
      4, False, "contiguous", id="4-dynamic", marks=pytest.mark.slow
    ),
    pytest.param(4, True, "strided", id="4-static", marks=pytest.mark.slow),
  ],
)
def test_row_sharded_equals_replicated_on_one_replica(replicas, static, layout):
  emb = trained(
    replicas, static, layouts=TableLayout("row_sharded", row_layout=layout)
  )
  assert set(emb.placements().values()) == {"row_sharded"}
  compiled.assert_close(state(trained(1, static)), state(emb))


def test_compiled_single_replica_row_sharded_step_is_static():
  """XLA compiles the exchange (1 replica) with static shapes only."""
  data = compiled.make_batches(2)
  want, _ = compiled.run(E.SGD(0.1), False, data)
  got, step = compiled.run(
    E.SGD(0.1), True, data, layouts=TableLayout("row_sharded")
  )
  compiled.assert_close(compiled.table_state(want), compiled.table_state(got))
  hlo = step.experimental_get_compiler_ir(*got.preprocess(*data[0]))(
    stage="hlo"
  )
  assert "<=" not in hlo


# -- ids owned by other replicas, empty bags ----------------------------------

VOCAB, DIM = 9, 3


def _small(strategy, static):
  table = E.TableConfig(
    VOCAB,
    DIM,
    name="t",
    combiner="mean",
    initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=5),
  )
  with strategy.scope():
    emb = TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)},
      E.Adagrad(0.5),
      strategy,
      bag_widths=3,
      static_shapes=static,
      layouts=TableLayout("row_sharded"),
    )
    emb.build()
  return emb


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_ids_owned_elsewhere_and_a_replica_with_empty_bags(static):
  """Replica 0 asks only for rows replica 1 owns; replica 1's bags are empty.

  Strided rows over 2 replicas: odd ids live on replica 1. Replica 0 gets
  them through the exchange, replica 1 (nothing to look up) still takes part
  and applies replica 0's gradients to its rows.
  """
  strategy = mirrored_strategy(2)
  emb = _small(strategy, static)
  ref = _small(tf.distribute.get_strategy(), static)
  table = tf.convert_to_tensor(emb.embedding_tables[emb.tables[0]]).numpy()
  np.testing.assert_allclose(
    table, tf.convert_to_tensor(ref.embedding_tables[ref.tables[0]]).numpy()
  )
  bags = [[1, 3, 3], [7], [5, 1]] + [[], [], []]  # replica 0 | replica 1
  ids = tf.ragged.constant(bags, dtype=tf.int64)
  upstream = np.random.default_rng(0).normal(size=(6, DIM)).astype(np.float32)

  def step(emb, features, up):
    with tf.GradientTape() as tape:
      acts = emb({"f": features}, training=True)["f"]
      tape.watch(acts)
      loss = tf.reduce_sum(acts * up)
    emb.apply_gradients({"f": tape.gradient(loss, acts)})
    return acts

  @tf.function
  def run(features, up):
    def local(ctx):
      i = ctx.replica_id_in_sync_group
      return tf.nest.map_structure(
        lambda x: x[i * 3 : (i + 1) * 3], (features, up)
      )

    per_replica = strategy.experimental_distribute_values_from_function(local)
    acts = strategy.run(step, args=(emb,) + tuple(per_replica))
    return tf.concat(strategy.experimental_local_results(acts), 0)

  padded = emb.preprocess({"f": ids})[0]["f"]
  acts = run(padded, tf.constant(upstream)).numpy()
  want = np.stack([table[b].mean(0) if b else np.zeros(DIM) for b in bags])
  np.testing.assert_allclose(acts, want, rtol=1e-6, atol=1e-6)
  step(ref, ref.preprocess({"f": ids})[0]["f"], tf.constant(upstream))
  compiled.assert_close(state(ref), state(emb))


# -- checkpoints ---------------------------------------------------------------


def test_checkpoints_move_from_4_sharded_to_1_replicated_and_back(tmp_path):
  sharded = trained(
    4, False, layouts=TableLayout("row_sharded", row_layout="contiguous")
  )
  path = tf.train.Checkpoint(embedding=sharded).save(str(tmp_path / "s"))
  # TF's mid-level layout: full tables and slots.
  keys = dict(tf.train.list_variables(path))
  assert keys["embedding/shared/.ATTRIBUTES/VARIABLE_VALUE"] == [23, 7]
  assert keys["embedding/sq.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"] == [
    31,
    7,
  ]
  one = make(tf.distribute.get_strategy())
  checkpoint_lib.restore(one, path)
  compiled.assert_close(state(sharded), state(one))

  # And back: a replicated run restored into 4 shards, before they exist.
  replicated = trained(1, False)
  back = tf.train.Checkpoint(embedding=replicated).save(str(tmp_path / "r"))
  four = mirrored_strategy(4)
  with four.scope():
    fresh = TensorCoreEmbedding(
      every_case_config(),
      E.SGD(0.1),
      four,
      bag_widths=WIDTHS,
      layouts=TableLayout("row_sharded"),
    )
  tf.train.Checkpoint(embedding=fresh).restore(back)  # restored on build
  fresh.build()
  compiled.assert_close(state(replicated), state(fresh))
  features, weights = batches(1, seed=3)[0]
  got = ServingEmbedding.from_backend(fresh).lookup(features, weights)
  want = ServingEmbedding.from_backend(replicated).lookup(features, weights)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key])


def assert_tf_serving_reads(path: str, want: dict) -> None:
  """TF's own TPUEmbeddingForServing restores `want`'s tables from `path`."""
  config = every_case_config()
  for feature in config.values():
    feature.table.optimizer = None
  serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
    config, E.SGD(0.1)
  )
  serving.build()
  tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
  for table, var in serving.embedding_tables.items():
    np.testing.assert_array_equal(var.numpy(), want[f"{table.name}/parameters"])


def test_tf_serving_embedding_reads_a_sharded_checkpoint(tmp_path):
  """TF's own TPUEmbeddingForServing restores a 2-replica checkpoint."""
  sharded = trained(
    2, True, layouts=TableLayout("row_sharded", row_layout="contiguous")
  )
  path = tf.train.Checkpoint(embedding=sharded).save(str(tmp_path / "s"))
  assert_tf_serving_reads(path, state(sharded))


def test_row_sharded_options_are_checked():
  config = every_case_config()
  with pytest.raises(ValueError, match=r"unknown tables \['nope'\]"):
    TensorCoreEmbedding(
      config, E.SGD(0.1), layouts={"nope": TableLayout("row_sharded")}
    )
  with pytest.raises(
    ValueError, match="placement = 'parameter_servers'.*row_sharded"
  ):
    TensorCoreEmbedding(
      config, E.SGD(0.1), layouts={"sq": TableLayout("parameter_servers")}
    )
  with pytest.raises(ValueError, match="row_layout = 'mod'.*'strided'"):
    TensorCoreEmbedding(
      config, E.SGD(0.1), layouts=TableLayout("row_sharded", row_layout="mod")
    )
  custom_slots = E.Adagrad(0.1, slot_variable_creation_fn=lambda *args: {})
  table = E.TableConfig(9, 3, name="t", optimizer=custom_slots)
  with pytest.raises(
    backends_base.UnsupportedConfigError, match="'t'.*slot_variable_creation"
  ):
    TensorCoreEmbedding(
      {"f": E.FeatureConfig(table)}, None, layouts=TableLayout("row_sharded")
    )
