"""Checkpoints move between backends and TF's classes; mismatches fail loudly.

For every optimizer: `tensorcore` trains two steps (slots non-trivial), is
saved, restored into TF's own `TPUEmbeddingForServing` and `TPUEmbedding`
(CPU mode), which are saved again, and that checkpoint is restored into a
fresh `tensorcore`: tables and slots must be bit-identical all the way.
Restoring a checkpoint whose tables differ (name, vocabulary size, dim,
optimizer slots) must fail naming the table and both shapes.
"""

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import checkpoint as ckpt  # noqa: E402
from backends.mid_level.serving import ServingEmbedding  # noqa: E402
from backends.tensorcore.backend import TensorCoreEmbedding  # noqa: E402

E = tf.tpu.experimental.embedding

OPTIMIZERS = {
  "sgd": lambda: E.SGD(0.1),
  "adagrad": lambda: E.Adagrad(0.1),
  "adagrad_momentum": lambda: E.AdagradMomentum(0.1, momentum=0.9),
  "adam": lambda: E.Adam(0.05),
  "ftrl": lambda: E.FTRL(0.1, l1_regularization_strength=0.01),
}
TF_CLASSES = {
  "TPUEmbeddingForServing": E.TPUEmbeddingForServing,
  "TPUEmbedding": E.TPUEmbedding,  # CPU mode: plain variables, TF's layout
}


def _config(vocab=23, dim=7, name="users", with_items=True):
  """Fresh configs each call: TF's classes write into the TableConfigs."""
  users = E.TableConfig(vocab, dim, name=name, combiner="sum")
  config = {"user": E.FeatureConfig(users), "friend": E.FeatureConfig(users)}
  if with_items:
    config["item"] = E.FeatureConfig(E.TableConfig(11, 11, name="items"))
  return config


def _trained_tensorcore(opt_name, config=None):
  emb = TensorCoreEmbedding(config or _config(), OPTIMIZERS[opt_name]())
  emb.build()
  rng = np.random.default_rng(0)
  for _ in range(2):
    features = {
      "user": tf.constant(rng.integers(0, 23, size=5)),
      "friend": tf.ragged.constant(
        [[1, 2], [3], [4, 5, 6], [1], [22]], dtype=tf.int64
      ),
    }
    if "item" in emb.feature_config:
      features["item"] = tf.constant(rng.integers(0, 11, size=5))
    with tf.GradientTape() as tape:
      acts = emb.lookup(features, training=True)
      tape.watch(acts)
      loss = sum(tf.reduce_sum(a * a) for a in acts.values())
    emb.apply_gradients(tape.gradient(loss, acts))
  return emb


def _embedding_values(path):
  reader = tf.train.load_checkpoint(path)
  return {
    k: reader.get_tensor(k)
    for k, _ in tf.train.list_variables(path)
    if k.startswith("embedding/")
  }


def _backend_values(emb):
  out = {}
  for table, var in emb.embedding_tables.items():
    out[emb.table_name(table)] = var.numpy()
  for name, slots in emb.slot_variables().items():
    for slot, var in slots.items():
      out[f"{name}/{slot}"] = var.numpy()
  return out


@pytest.mark.parametrize("tf_class", sorted(TF_CLASSES))
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_round_trip_through_tf_classes_is_bit_identical(
  tmp_path, opt_name, tf_class
):
  trained = _trained_tensorcore(opt_name)
  before = _backend_values(trained)
  assert (
    any(np.any(v != 0) for k, v in before.items() if "/" in k)
    or opt_name == "sgd"
  )
  first = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "tc"))

  tf_emb = TF_CLASSES[tf_class](_config(), OPTIMIZERS[opt_name]())
  tf_emb.build()
  tf.train.Checkpoint(embedding=tf_emb).restore(first).assert_consumed()
  second = tf.train.Checkpoint(embedding=tf_emb).save(str(tmp_path / "tf"))
  a, b = _embedding_values(first), _embedding_values(second)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)

  fresh = TensorCoreEmbedding(_config(), OPTIMIZERS[opt_name]())
  ckpt.restore(fresh, second)  # before build: restored on creation
  fresh.build()
  after = _backend_values(fresh)
  assert sorted(after) == sorted(before)
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@pytest.mark.parametrize("opt_name", ["adagrad", "ftrl"])
def test_round_trip_through_serving_backend_after_build(tmp_path, opt_name):
  trained = _trained_tensorcore(opt_name)
  first = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "tc"))
  serving = ServingEmbedding(_config(), OPTIMIZERS[opt_name]())
  serving.build()
  ckpt.restore(serving, str(tmp_path))  # a directory: its latest checkpoint
  want = _backend_values(trained)
  got = _backend_values(serving)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  del first


def test_serving_without_optimizer_restores_tables_only(tmp_path):
  trained = _trained_tensorcore("adam")
  path = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "tc"))
  serving = ServingEmbedding(_config())
  ckpt.restore(serving, path)
  assert serving.slot_variables() == {"users": {}, "items": {}}
  for table, var in serving.embedding_tables.items():
    want = trained.embedding_tables[
      next(t for t in trained.embedding_tables if t.name == table.name)
    ]
    np.testing.assert_array_equal(var.numpy(), want.numpy())


@pytest.fixture(name="adagrad_checkpoint", scope="module")
def _adagrad_checkpoint(tmp_path_factory):
  trained = _trained_tensorcore("adagrad")
  return tf.train.Checkpoint(embedding=trained).save(
    str(tmp_path_factory.mktemp("ckpt") / "tc")
  )


_MISMATCHES = [
  (
    {"vocab": 29},
    "adagrad",
    r"table 'users': checkpoint shape \[23, 7\], backend shape \[29, 7\]",
  ),
  (
    {"dim": 11},
    "adagrad",
    r"table 'users': checkpoint shape \[23, 7\], backend shape \[23, 11\]",
  ),
  (
    {"name": "members"},
    "adagrad",
    r"table 'members' \[23, 7\] is not in the checkpoint; it has "
    r"'items' \[11, 11\], 'users' \[23, 7\](.|\n)*has table 'users'",
  ),
  (
    {},
    "adam",
    r"table 'users': the backend's optimizer Adam has slots \['momenta', "
    r"'velocities'\], the checkpoint has \['accumulators'\]",
  ),
  ({}, "adagrad_momentum", r"slots \['accumulators', 'momenta'\]"),
  (
    {},
    "sgd",
    r"optimizer SGD has slots \[\], the checkpoint has "
    r"\['accumulators'\]",
  ),
]


# A lookup-only serving backend without slots accepts (ignores) a checkpoint's
# slots by design, so the SGD case applies to training backends only.
@pytest.mark.parametrize(
  "backend_cls,config_kwargs,opt_name,expected",
  [
    (cls, *case)
    for cls in (TensorCoreEmbedding, ServingEmbedding)
    for case in _MISMATCHES
    if not (cls is ServingEmbedding and case[1] == "sgd")
  ],
)
def test_mismatched_checkpoint_fails_naming_table_and_shapes(
  adagrad_checkpoint, backend_cls, config_kwargs, opt_name, expected
):
  emb = backend_cls(_config(**config_kwargs), OPTIMIZERS[opt_name]())
  with pytest.raises(ckpt.CheckpointMismatchError, match=expected):
    ckpt.restore(emb, adagrad_checkpoint)


def test_extra_table_in_checkpoint_fails_unless_allowed(adagrad_checkpoint):
  emb = TensorCoreEmbedding(_config(with_items=False), E.Adagrad(0.1))
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"has table 'items' \[11, 11\], which the backend "
    r"does not have",
  ):
    ckpt.verify_compatible(adagrad_checkpoint, emb)
  ckpt.restore(emb, adagrad_checkpoint, allow_extra_tables=True)
  emb.build()
  want = tf.train.load_checkpoint(adagrad_checkpoint).get_tensor(
    "embedding/users/.ATTRIBUTES/VARIABLE_VALUE"
  )
  np.testing.assert_array_equal(
    next(iter(emb.embedding_tables.values())).numpy(), want
  )


def test_wrong_prefix_and_missing_directory(adagrad_checkpoint, tmp_path):
  emb = TensorCoreEmbedding(_config(), E.Adagrad(0.1))
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"no variables under 'model/'.*'embedding'",
  ):
    ckpt.verify_compatible(adagrad_checkpoint, emb, prefix="model/")
  with pytest.raises(FileNotFoundError, match="no checkpoint in directory"):
    ckpt.verify_compatible(str(tmp_path), emb)


def test_table_names_with_dots_are_unescaped(tmp_path):
  config = {"f": E.FeatureConfig(E.TableConfig(23, 7, name="user.id"))}
  emb = TensorCoreEmbedding(config, E.Adagrad(0.1))
  emb.build()
  path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "c"))
  assert [e.name for e in ckpt.expected_tables(emb)] == ["user.id"]
  assert ckpt.verify_compatible(path, emb) == path


def _sparsecore_style_checkpoint(tmp_path, slot_names):
  """A checkpoint shaped like TPUEmbeddingV2's: stacked tables + layouts.

  The layouts come from TF's own SparseCore stacker (it runs on CPU); the
  stacked variables have the padded, stacked shapes those layouts give.
  """
  from tensorflow.core.tpu.kernels import sparse_core_layout_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.tpu import tpu_embedding_v3, tpu_embedding_v3_utils  # pylint: disable=g-import-not-at-top
  from tensorflow.python.trackable import autotrackable  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top

  config = _config()
  for feature in config.values():
    feature.output_shape = tf.TensorShape([8])
    feature.table.optimizer = E.Adagrad(0.1)
  tables = []
  for feature in nest.flatten(config):
    if feature.table not in tables:
      tables.append(feature.table)
  stacking = tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
    tables, nest.flatten_with_joined_string_paths(config), 2, 4, None
  )
  layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
  layouts.tables.extend(stacking.table_to_layout.values())
  node = autotrackable.AutoTrackable()
  node._track_trackable(
    tpu_embedding_v3_utils.SparseCoreLayoutsTrackable(
      tf.constant(layouts.SerializeToString())
    ),
    tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY,
  )
  for stacked, members in stacking.stacked_table_to_tables.items():
    rows = sum(t.vocabulary_size for t in members)
    shape = (rows, members[0].dim)
    node._track_trackable(tf.Variable(tf.zeros(shape)), stacked)
    for slot in slot_names:
      node._track_trackable(tf.Variable(tf.zeros(shape)), f"{stacked}/{slot}")
  return tf.train.Checkpoint(embedding=node).save(str(tmp_path / "sc"))


def test_sparsecore_checkpoints_are_checked_by_their_layouts(tmp_path):
  path = _sparsecore_style_checkpoint(tmp_path, ["accumulators"])
  assert (
    ckpt.verify_compatible(path, ServingEmbedding(_config(), E.Adagrad(0.1)))
    == path
  )
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"table 'users': checkpoint shape \[23, 7\], "
    r"backend shape \[29, 7\]",
  ):
    ckpt.verify_compatible(path, ServingEmbedding(_config(vocab=29)))
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match="SparseCore.*stacked tables; the 'tensorcore' backend "
    "cannot read them. Restore it into the 'serving' backend",
  ):
    ckpt.verify_compatible(path, TensorCoreEmbedding(_config(), E.Adagrad(0.1)))
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"optimizer Adam has slots \['momenta', 'velocities'\]",
  ):
    ckpt.verify_compatible(path, ServingEmbedding(_config(), E.Adam(0.1)))
