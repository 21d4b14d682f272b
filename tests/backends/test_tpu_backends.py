"""The TPU backends on CPU: what they hand to TF's classes, and what they
refuse.

No TPU is reachable here. `TPUEmbedding` (V1) is constructed for real from
the backend's arguments in TF's CPU mode, and TF's own code checks the rest:
the table descriptor each table configures the embedding engine with, the
output shapes TF derives from the per-replica input shapes, and SparseCore's
table stacking of the V2 arguments. The V0 backend's gradient bookkeeping is
checked against NumPy. `recsys.tools.tpu_smoke` runs the real thing on a TPU.
"""

import inspect  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf.tpu import (
  tpu_embedding_configuration_pb2 as config_pb2,
)  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3  # noqa: E402
from tensorflow.python.util import nest  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import base  # noqa: E402
from backends.mid_level import tpu_embedding_v0  # noqa: E402
from backends.mid_level.tpu_embedding import (  # noqa: E402
  TablesOnDeviceError,
  TPUEmbeddingBackend,
)
from backends.mid_level.tpu_embedding_v0 import TPUEmbeddingV0Backend  # noqa: E402
from tests.backends.test_selection import fake_tpu_strategy  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402

E = tf.tpu.experimental.embedding
B = 8  # per-replica batch: a multiple of the 4 SparseCores per chip


def _config(**table_kwargs):
  """Users (shared by two features, one a sequence) and items (own
  optimizer)."""
  users = E.TableConfig(
    23,
    7,
    name="users",
    combiner="sqrtn",
    initializer=tf.keras.initializers.Constant(0.5),
    **table_kwargs,
  )
  items = E.TableConfig(
    11,
    11,
    combiner="sum",
    optimizer=E.AdagradMomentum(0.2, momentum=0.9, use_nesterov=True),
  )
  return {
    "user": E.FeatureConfig(users, name="user"),
    "history": E.FeatureConfig(users, max_sequence_length=3),
    "item": E.FeatureConfig(items, output_shape=[B]),
  }


def _v2_config():
  config = _config()
  del config["history"]  # SparseCore has no sequence features
  return config


def _backend(config, optimizer=None, feature="V1", **kwargs):
  return TPUEmbeddingBackend(
    config,
    optimizer or E.Adagrad(0.1),
    strategy=fake_tpu_strategy(feature),
    **kwargs,
  )


# -- what is passed to TF ------------------------------------------------------


@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_configs_are_copied_whole_and_the_users_are_untouched(feature):
  config = _config() if feature == "V1" else _v2_config()
  default = E.Adam(0.01, lazy_adam=True)
  emb = _backend(config, default, feature, per_replica_batch_size=B)
  kwargs = emb._tf_constructor_kwargs()
  assert kwargs["optimizer"] is None
  assert kwargs["pipeline_execution_with_tensor_core"] is False
  copied = kwargs["feature_config"]
  assert sorted(copied) == sorted(config)
  for name, feature_config in config.items():
    got, want = copied[name], feature_config
    assert got is not want and got.table is not want.table
    assert got.name == want.name
    assert got.max_sequence_length == want.max_sequence_length
    assert got.validate_weights_and_indices == want.validate_weights_and_indices
    for attr in (
      "vocabulary_size",
      "dim",
      "initializer",
      "combiner",
      "quantization_config",
      "layout",
      "dtype",
    ):
      assert getattr(got.table, attr) is getattr(want.table, attr), attr
  if feature == "V1":
    assert copied["history"].table is copied["user"].table  # still shared
  assert copied["user"].table.name == "users"
  # An unnamed table is named like TF does: table_<index in first-use order>
  # (features flatten in sorted key order: history, item, user).
  want_name = "table_1" if feature == "V1" else "table_0"
  assert copied["item"].table.name == want_name
  # The optimizers themselves, or (V1) field-for-field equal copies.
  assert copied["user"].table.optimizer == default
  assert copied["item"].table.optimizer == config["item"].table.optimizer
  # The user's objects are as they were.
  assert config["user"].table.optimizer is None
  assert config["item"].table.name is None
  if feature == "V2":
    assert copied["user"].output_shape == tf.TensorShape([B])
    assert config["user"].output_shape == tf.TensorShape(None)
    assert kwargs["sparse_core_embedding_config"] is None
  # The keyword arguments are exactly what TF's class accepts.
  inspect.signature(emb._tf_class().__init__).bind(None, **kwargs)


def test_v1_arguments_build_tf_tpu_embedding_with_tf_layout(tmp_path):
  emb = _backend(
    _config(),
    E.FTRL(0.1, multiply_linear_by_learning_rate=True),
    per_replica_batch_size=B,
    pipeline_execution_with_tensor_core=True,
  )
  kwargs = emb._tf_constructor_kwargs()
  assert kwargs["pipeline_execution_with_tensor_core"] is True
  tf_emb = E.TPUEmbedding(**kwargs)  # CPU mode of the real class
  tf_emb.build()
  keys = sorted(
    k
    for k, _ in tf.train.list_variables(
      tf.train.Checkpoint(embedding=tf_emb).write(str(tmp_path / "c"))
    )
  )
  assert sorted(
    k.split("/")[1] for k in keys if k.startswith("embedding/")
  ) == [
    "table_1",
    "table_1.Saccumulators",
    "table_1.Smomenta",
    "users",
    "users.Saccumulators",
    "users.Slinears",
  ]


def test_v1_output_shapes_from_the_per_replica_batch():
  emb = _backend(_config(), per_replica_batch_size=B)
  tf_emb = E.TPUEmbedding(**emb._tf_constructor_kwargs())
  shapes = tf_emb._get_output_shapes_from_input_shapes(
    emb._per_replica_input_shapes()
  )
  # Flattened feature order: history (sequence of 3), item, user.
  assert [s.as_list() for s in shapes] == [[B, 3], [B], [B]]
  unknown = _backend(_config())._per_replica_input_shapes()
  assert unknown is None  # TF then configures the engine at the first lookup


@pytest.mark.parametrize(
  "opt,check",
  [
    (
      E.SGD(
        0.1,
        clipvalue=2.0,
        clip_weight_min=-1.0,
        clip_weight_max=1.0,
        weight_decay_factor=0.01,
        multiply_weight_decay_factor_by_learning_rate=True,
      ),
      lambda p: (
        p.gradient_clipping_limits.lower.value == -2.0
        and p.gradient_clipping_limits.upper.value == 2.0
        and p.clipping_limits.lower.value == -1.0
        and p.clipping_limits.upper.value == 1.0
        and abs(p.weight_decay_factor - 0.01) < 1e-9
        and p.multiply_weight_decay_factor_by_learning_rate
        and p.HasField("stochastic_gradient_descent")
      ),
    ),
    (
      E.Adam(0.1, lazy_adam=False, sum_inside_sqrt=False),
      lambda p: p.adam.use_non_lazy_adam and not p.adam.use_sum_inside_sqrt,
    ),
    (
      E.AdagradMomentum(0.1, momentum=0.5, beta2=0.9, exponent=3.0),
      lambda p: (
        p.adagrad_momentum.exponent == 3.0
        and p.adagrad_momentum.momentum == 0.5
        and abs(p.adagrad_momentum.beta2 - 0.9) < 1e-7
      ),
    ),
    (
      E.FTRL(0.1, beta=0.5, allow_zero_accumulator=True),
      lambda p: p.ftrl.allow_zero_accumulator and p.ftrl.beta == 0.5,
    ),
  ],
  ids=["sgd_clip_decay", "adam", "adagrad_momentum", "ftrl"],
)
def test_v1_optimizer_options_reach_the_engine_configuration(opt, check):
  """TF's own descriptor code, on the table the backend hands to TF."""
  emb = _backend(
    {"f": E.FeatureConfig(E.TableConfig(23, 7, name="t"))},
    opt,
    per_replica_batch_size=B,
  )
  table = emb._tf_constructor_kwargs()["feature_config"]["f"].table
  descriptor = config_pb2.TPUEmbeddingConfiguration.TableDescriptor()
  table._set_table_descriptor(descriptor, num_hosts=1, learning_rate_index={})
  assert descriptor.name == "t" and descriptor.vocabulary_size == 23
  assert (
    descriptor.optimization_parameters.learning_rate.constant
    == pytest.approx(0.1)
  )
  assert check(descriptor.optimization_parameters), descriptor


def test_v1_tables_configure_the_engine_despite_tf_packing_status_bug():
  """TF 2.21 + protobuf upb: TF's own optimizers fail to fill the engine proto.

  If this starts failing because TF fixed the bug, drop the workaround
  (`_with_proto_packing_status`) and this test.
  """
  opt = E.Adagrad(0.1)
  emb = _backend({"f": E.FeatureConfig(E.TableConfig(23, 7, name="t"))}, opt)
  descriptor = config_pb2.TPUEmbeddingConfiguration.TableDescriptor()
  with pytest.raises(TypeError, match="low_dimensional_packing_status"):
    E.TableConfig(23, 7, name="t", optimizer=opt)._set_table_descriptor(
      descriptor, num_hosts=1, learning_rate_index={}
    )
  table = emb._tf_constructor_kwargs()["feature_config"]["f"].table
  table._set_table_descriptor(descriptor, num_hosts=1, learning_rate_index={})
  assert descriptor.optimization_parameters.HasField("adagrad")
  assert table.optimizer == opt and hash(table.optimizer) == hash(opt)


def test_v2_arguments_are_stacked_by_tf_sparsecore_layout():
  config = E.SparseCoreEmbeddingConfig(disable_table_stacking=True)
  emb = _backend(
    _v2_config(),
    E.Adagrad(0.1),
    "V2",
    per_replica_batch_size=B,
    sparse_core_embedding_config=config,
  )
  kwargs = emb._tf_constructor_kwargs()
  assert kwargs["sparse_core_embedding_config"] is config
  features = tpu_embedding_v3._clone_feature_config(kwargs["feature_config"])
  tables = []
  for f in nest.flatten(features):
    if f.table not in tables:
      tables.append(f.table)
  stacking = tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
    tables,
    nest.flatten_with_joined_string_paths(features),
    2,
    emb.sparsecores_per_chip,
    config,
  )
  assert sorted(stacking.table_to_layout) == ["table_0", "users"]
  assert stacking.table_to_layout["users"].unsharded_shape == [23, 7]


def test_input_options_keep_ids_on_the_host():
  for emb in (
    _backend(_config()),
    TPUEmbeddingV0Backend(
      _config(), E.SGD(0.1), strategy=fake_tpu_strategy("UNSUPPORTED")
    ),
  ):
    assert emb.input_options().experimental_fetch_to_device is False


def test_preprocess_makes_dense_bags_sparse_keeping_id_zero():
  emb = _backend(_config(), per_replica_batch_size=B)
  ids = tf.constant([[0, 3, 0], [5, 0, 22]], tf.int64)
  weights = tf.constant([1.0, 2.0])
  features = {"user": tf.constant([4, 0]), "history": ids, "item": ids}
  out, out_w = emb.preprocess(
    features, {"user": weights, "history": None, "item": None}
  )
  for name in ("history", "item"):
    assert isinstance(out[name], tf.SparseTensor)
    np.testing.assert_array_equal(tf.sparse.to_dense(out[name]).numpy(), ids)
    assert out[name].values.shape[0] == 6
  assert isinstance(out["user"], tf.SparseTensor)  # dense ids with weights
  np.testing.assert_array_equal(out["user"].values.numpy(), [4, 0])
  np.testing.assert_array_equal(out_w["user"].values.numpy(), [1.0, 2.0])
  plain, none = emb.preprocess(
    {
      "user": tf.constant([1, 2]),
      "history": tf.ragged.constant([[1], [2, 3]]),
      "item": tf.constant([[3], [4]]),
    }
  )
  assert none is None and isinstance(plain["user"], tf.Tensor)
  assert isinstance(plain["item"], tf.Tensor)  # [B, 1]: TF takes it as is


def test_tables_on_the_device_cannot_be_read_directly():
  with pytest.raises(
    TablesOnDeviceError, match="restore it into.*ServingEmbedding"
  ):
    _ = _backend(_config()).embedding_tables


# -- refusals ------------------------------------------------------------------


def test_adagrad_momentum_and_every_optimizer_are_accepted():
  for feature in ("V1", "V2"):
    for opt in (
      E.SGD(0.1),
      E.Adagrad(0.1),
      E.AdagradMomentum(0.1),
      E.Adam(0.1),
      E.FTRL(0.1),
    ):
      _backend(_v2_config(), opt, feature, per_replica_batch_size=B)


@pytest.mark.parametrize(
  "table_kwargs,expected",
  [
    (
      {"layout": object()},
      r"table 'users': layout is a SparseCore \(V2\) setting",
    ),
    (
      {"dtype": tf.int32},
      r"table 'users': dtype=int32; the V1 embedding engine",
    ),
  ],
)
def test_v1_refuses_what_the_engine_would_ignore(table_kwargs, expected):
  with pytest.raises(base.UnsupportedConfigError, match=expected):
    _backend(_config(**table_kwargs))


@pytest.mark.parametrize(
  "opt,expected",
  [
    (E.SGD(0.1, clipvalue=1.0), r"SGD clipvalue=\(-1.0, 1.0\)"),
    (E.Adagrad(0.1, clip_weight_min=-3.0), r"Adagrad clip_weight_min=-3.0"),
    (E.Adagrad(0.1, clip_weight_max=3.0), r"clip_weight_max=3.0"),
    (E.Adam(0.1, lazy_adam=False), r"Adam lazy_adam=False"),
    (E.Adam(0.1, weight_decay_factor=0.1), r"weight_decay_factor=0.1"),
    (
      E.SGD(0.1, use_gradient_accumulation=False),
      r"use_gradient_accumulation=False",
    ),
    (E.FTRL(0.1, allow_zero_accumulator=True), r"allow_zero_accumulator=True"),
  ],
)
def test_sparsecore_refuses_optimizer_options_it_ignores(opt, expected):
  with pytest.raises(
    base.UnsupportedConfigError,
    match=r"table 'users': SparseCore ignores .*" + expected,
  ):
    _backend(_v2_config(), opt, "V2", per_replica_batch_size=B)


def test_sparsecore_refuses_sequences_and_unknown_or_odd_batches():
  with pytest.raises(
    base.UnsupportedConfigError,
    match=r"feature 'history' \(table 'users'\): "
    r"max_sequence_length=3; TPUEmbeddingV2 has no sequence",
  ):
    _backend(_config(), feature="V2", per_replica_batch_size=B)
  with pytest.raises(
    base.UnsupportedConfigError,
    match=r"feature 'user' \(table 'users'\): SparseCore needs "
    r"static per-replica output shapes; pass per_replica_batch_size",
  ):
    _backend(_v2_config(), feature="V2")
  with pytest.raises(
    base.UnsupportedConfigError,
    match=r"feature 'user'.*6 samples per replica is not a "
    r"multiple of the 4 SparseCores",
  ):
    _backend(_v2_config(), feature="V2", per_replica_batch_size=6)
  with pytest.raises(
    base.UnsupportedConfigError,
    match="sparse_core_embedding_config applies to SparseCore",
  ):
    _backend(
      _config(), sparse_core_embedding_config=E.SparseCoreEmbeddingConfig()
    )


def test_all_problems_are_reported_at_once():
  with pytest.raises(base.UnsupportedConfigError) as info:
    _backend(
      _config(),
      E.Adam(0.1, lazy_adam=False, clipvalue=1.0),
      "V2",
      per_replica_batch_size=B,
    )
  message = str(info.value)
  assert "lazy_adam=False" in message and "clipvalue" in message
  assert "max_sequence_length" in message and "backend='tensorcore'" in message


def test_v0_checks_optimizers_like_every_backend():
  strategy = fake_tpu_strategy("UNSUPPORTED")
  emb = TPUEmbeddingV0Backend(_config(), E.Adam(0.1), strategy=strategy)
  assert emb.capabilities.needs_tpu and not emb.capabilities.sharded_tables
  with pytest.raises(base.UnsupportedConfigError):
    TPUEmbeddingV0Backend(_config(), object(), strategy=strategy)


# -- dynamic tables on TPUEmbedding: only vocabularies that never reuse a row --


@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_tpu_embedding_takes_only_vocabularies_that_never_reuse_a_row(feature):
  """The engine's memory has no write of one row: a vocabulary that
  evicts (a reused row must start again) or reads zeros for unknown ids
  (left out of their bags on the host) is refused naming the table and
  each setting; one that never reuses a row, and hashed ids, are taken,
  their batches mapped on the host (ids stay there)."""
  from backends.layout import TableLayout  # noqa: PLC0415
  from backends.vocabulary import DynamicVocabulary, HashedIds  # noqa: PLC0415

  config = _config() if feature == "V1" else _v2_config()
  with pytest.raises(
    base.UnsupportedConfigError,
    match=r"table 'users': DynamicVocabulary eviction = 'lru' \(needs "
    r"'none'\) and unknown = 'zeros' \(needs 'unknown_row'\)",
  ):
    _backend(
      config,
      feature=feature,
      per_replica_batch_size=B,
      layouts={"users": TableLayout(vocabulary=DynamicVocabulary())},
    )
  for kept in (
    DynamicVocabulary(eviction="none", unknown="unknown_row", admit_after=2),
    HashedIds(),
  ):
    emb = _backend(
      config,
      feature=feature,
      per_replica_batch_size=B,
      layouts={"users": TableLayout(vocabulary=kept)},
    )
    assert emb.layouts()["users"].vocabulary == kept
    assert emb.input_options().experimental_fetch_to_device is False


def test_tf_tpu_embedding_maps_ids_into_rows_never_reused_and_saves_the_index(
  monkeypatch, tmp_path
):
  """TF's TPUEmbedding in its CPU mode (no lookups there): the backend's
  index gives each admitted id its own row, never another's (12 ids, 7
  rows: the rest read the unknown row, nothing evicted), and is saved
  beside TF's tables; a restore requested before the backend is built
  restores it."""
  from backends.layout import TableLayout  # noqa: PLC0415
  from backends.mid_level import tpu_embedding  # noqa: PLC0415
  from backends.vocabulary import DynamicVocabulary  # noqa: PLC0415

  monkeypatch.setattr(tpu_embedding, "_hardware_version", lambda s: "V1")
  monkeypatch.setattr(
    TPUEmbeddingBackend, "unavailable_reason", classmethod(lambda c, s: None)
  )

  def make():
    table = E.TableConfig(8, 4, name="t")
    return TPUEmbeddingBackend(
      {"f": E.FeatureConfig(table)},
      E.Adagrad(0.1),
      tf.distribute.get_strategy(),
      per_replica_batch_size=4,
      layouts={
        "t": TableLayout(
          vocabulary=DynamicVocabulary(eviction="none", unknown="unknown_row")
        )
      },
    )

  emb = make()
  raw = [
    np.arange(4 * k, 4 * k + 4, dtype=np.int64) * 7919 + 2**40 for k in range(3)
  ]
  given = [
    emb.map_ids({"f": tf.constant(ids)}, True)["f"].numpy() for ids in raw
  ]
  rows = np.concatenate(given)
  assert rows[:7].tolist() == list(range(7))  # each id its own row
  assert np.all(rows[7:] == 7)  # full: the unknown row, no row taken back
  counters = {
    k: int(v) for k, v in emb.dynamic_tables()["t"].counters().items()
  }
  assert counters["evictions"] == 0 and counters["default_hits"] == 5
  path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "c"))
  keys = [k for k, _ in tf.train.list_variables(path)]
  assert "embedding/t/.ATTRIBUTES/VARIABLE_VALUE" in keys
  assert (
    "embedding/vocabularies/tables/t/keys/.ATTRIBUTES/VARIABLE_VALUE" in keys
  )
  restored = make()
  status = tf.train.Checkpoint(embedding=restored).restore(path)
  restored.build()
  status.assert_consumed()
  again = restored.map_ids({"f": tf.constant(np.concatenate(raw))}, False)
  np.testing.assert_array_equal(again["f"].numpy(), rows)


# -- V0's gradient bookkeeping -------------------------------------------------


def _v0_style_lookup(table, ragged):
  """What TF's V0 does with a ragged bag: densify (pad id 0, weight 0),
  gather."""
  ids = ragged.to_tensor(default_value=0)
  weights = tf.ones_like(ragged, tf.float32).to_tensor(default_value=0.0)
  rows = tf.nn.embedding_lookup(table, ids) * weights[..., None]
  return tf.reduce_sum(rows, 1)


def test_v0_row_gradients_keep_only_looked_up_rows_summed():
  table = tf.Variable(
    np.random.default_rng(0).normal(size=(23, 7)).astype(np.float32)
  )
  ragged = tf.ragged.constant([[3, 5, 3], [7], [5, 9]], dtype=tf.int64)
  dense = tf.constant([9, 22, 3], tf.int64)
  config = [
    ("bag", E.FeatureConfig(E.TableConfig(23, 7, name="t"))),
    ("one", E.FeatureConfig(E.TableConfig(23, 7, name="t"))),
  ]
  (touched,) = tpu_embedding_v0.touched_ids(
    config[:1] + config[1:], [ragged, dense], ["t"], lambda t: "t"
  )
  upstream = tf.constant(
    np.random.default_rng(1).normal(size=(3, 7)), tf.float32
  )
  with tf.GradientTape() as tape:
    acts = _v0_style_lookup(table, ragged) + tf.gather(table, dense)
  grad = tape.gradient(acts, table, output_gradients=upstream)
  assert isinstance(grad, tf.IndexedSlices)
  assert 0 in grad.indices.numpy()  # the padding row V0 gathers
  rows = tpu_embedding_v0.row_gradients(touched, grad, 7).numpy()
  want = {}
  for b, bag in enumerate([[3, 5, 3], [7], [5, 9]]):
    for i in bag + [[9, 22, 3][b]]:
      want[i] = want.get(i, 0) + upstream.numpy()[b]
  assert sorted(touched.numpy().tolist()) == sorted(want)
  for i, row in zip(touched.numpy(), rows):
    np.testing.assert_allclose(row, want[i], rtol=1e-6)


def test_v0_sequence_ids_beyond_the_length_are_not_touched():
  feature = E.FeatureConfig(
    E.TableConfig(23, 7, name="t"), max_sequence_length=2
  )
  ragged = tf.ragged.constant([[1, 2, 3], [4]], dtype=tf.int64)
  for ids in (ragged, ragged.to_sparse()):
    (touched,) = tpu_embedding_v0.touched_ids(
      [("s", feature)], [ids], ["t"], lambda t: "t"
    )
    assert sorted(touched.numpy().tolist()) == [1, 2, 4]


def test_v0_replicas_sum_their_rows():
  strategy = mirrored_strategy(2)
  per_replica_ids = [np.array([3, 5], np.int64), np.array([5, 8, 1], np.int64)]
  per_replica_grads = [np.full((2, 7), r + 1.0, np.float32) for r in range(2)]

  def fn(ctx_ids, ctx_grads):
    ctx = tf.distribute.get_replica_context()
    return tpu_embedding_v0.sum_over_replicas(ctx, ctx_ids, ctx_grads)

  # all_gather needs equal shapes: pad replica 0 with a repeated id of zero
  # grad.
  per_replica_ids[0] = np.array([3, 5, 3], np.int64)
  per_replica_grads[0] = np.concatenate(
    [per_replica_grads[0], np.zeros((1, 7), np.float32)]
  )
  per_replica_grads[1] = np.full((3, 7), 2.0, np.float32)
  ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(per_replica_ids[ctx.replica_id_in_sync_group])
  )
  grads = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(per_replica_grads[ctx.replica_id_in_sync_group])
  )
  out_ids, out_grads = strategy.run(fn, args=(ids, grads))
  for replica in range(2):
    got_ids = strategy.experimental_local_results(out_ids)[replica].numpy()
    got = strategy.experimental_local_results(out_grads)[replica].numpy()
    assert got_ids.tolist() == [3, 5, 8, 1]
    np.testing.assert_array_equal(got[:, 0], [1.0, 3.0, 2.0, 2.0])


# -- the TPU smoke tool --------------------------------------------------------


@pytest.mark.slow
def test_tpu_smoke_tool_imports_and_prints_help():
  out = subprocess.run(
    [sys.executable, "-m", "recsys.tools.tpu_smoke", "--help"],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  assert "--tpu" in out.stdout and "tensorcore" in out.stdout


@pytest.mark.slow
def test_tpu_smoke_training_loop_runs_on_cpu(tmp_path):
  """The smoke tool's loop and CPU read-back, with tensorcore on 2 replicas."""
  from recsys.tools import tpu_smoke  # pylint: disable=g-import-not-at-top

  path = tpu_smoke.train_and_save(
    mirrored_strategy(2),
    "tensorcore",
    "adagrad",
    steps=2,
    per_replica_batch=4,
    out=str(tmp_path),
  )
  values = tpu_smoke.read_on_cpu(path, "adagrad")
  assert sorted(values) == [
    "tags",
    "tags/accumulators",
    "users",
    "users/accumulators",
  ]
  initial = (
    tpu_smoke._feature_config()["user"]
    .table.initializer(
      (tpu_smoke.VOCAB["users"], tpu_smoke.DIMS["users"]), tf.float32
    )
    .numpy()
  )
  changed = np.any(values["users"] != initial, axis=1)
  assert 0 < changed.sum() <= 2 * 2 * 4  # only rows the 16 examples touched
  assert np.all(values["users/accumulators"][~changed] == 0.1)


@pytest.mark.tpu
@pytest.mark.skipif(
  not os.environ.get("RECSYS_TPU"),
  reason="no TPU reachable (set RECSYS_TPU=<tpu name or "
  "grpc://address> to run the smoke test on one)",
)
def test_tpu_smoke_on_a_real_tpu():
  subprocess.run(
    [
      sys.executable,
      "-m",
      "recsys.tools.tpu_smoke",
      "--tpu",
      os.environ["RECSYS_TPU"],
    ],
    check=True,
    timeout=3600,
  )
