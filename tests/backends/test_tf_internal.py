"""backends/_tf_internal.py against the TensorFlow installed.

Every `tensorflow.python` / `tensorflow.core` symbol the door imports or
reads off an imported module must exist (found by reading the door's source,
so a new one is checked without editing this file); every private attribute
it reads off TF's objects is listed here with the TF class that must have
it; and each named question is asked where the answer is known. A TF
upgrade that removes or renames one fails here, naming the symbol and the
door, not deep inside a backend's step.
"""

import importlib.util
import inspect
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from backends import _tf_internal
from tests import tf_door
from tests.conftest import mirrored_strategy

DOOR = pathlib.Path(_tf_internal.__file__)
WHERE = "backends/_tf_internal.py"
E = tf.tpu.experimental.embedding


def test_the_door_takes_something_from_tf():
  symbols = tf_door.tf_symbols(DOOR)
  assert "tensorflow.python.util.nest.flatten_up_to" in symbols
  assert len(symbols) > 20


@pytest.mark.parametrize("symbol", tf_door.tf_symbols(DOOR))
def test_every_tf_symbol_the_door_takes_exists(symbol):
  tf_door.check_symbol_exists(symbol, WHERE)


_MIRRORED_EXTENDED = importlib.import_module(
  "tensorflow.python.distribute.mirrored_strategy"
).MirroredExtended
_COLLECTIVE_ALL_REDUCE = _tf_internal.cross_device_ops.CollectiveAllReduce
_LAUNCHER = importlib.import_module(
  "tensorflow.python.distribute.cross_device_utils"
).CollectiveReplicaLauncher

# The TF classes each private attribute is read from, and whether it is an
# instance attribute (made in __init__) rather than a class attribute.
_PRIVATE_READS = {
  "_slot_names": [E.SGD, E.Adagrad, E.AdagradMomentum, E.Adam, E.FTRL],
  "_slot_initializers": [E.SGD, E.Adagrad, E.AdagradMomentum, E.Adam, E.FTRL],
  "_create_slots": [E.SGD, E.Adagrad, E.AdagradMomentum, E.Adam, E.FTRL],
  "_trackable_children": [_tf_internal.Trackable],
  "_lookup_dependency": [_tf_internal.Trackable],
  "_maybe_initialize_trackable": [_tf_internal.Trackable],
  "_deferred_dependencies": [_tf_internal.Trackable],  # a property
  "_add_variable_with_custom_getter": [_tf_internal.Trackable],
  "_track_trackable": [_tf_internal.Trackable],
  "_retrieve_variables": [E.TPUEmbedding],
  "_load_variables": [E.TPUEmbedding],
  "_variables": [E.TPUEmbeddingForServing],  # set in __init__
  "_using_tpu": [E.TPUEmbedding],  # set in __init__, read with getattr
  # The all-to-all: the strategy's collective launchers (set in __init__).
  "_collective_ops": [_MIRRORED_EXTENDED],
  "_cross_device_ops": [_MIRRORED_EXTENDED],
  "_launchers": [_COLLECTIVE_ALL_REDUCE],
  "_replica_id": [tf.distribute.ReplicaContext],
  "_device": [_LAUNCHER],
  "_group_key": [_LAUNCHER],
  "_group_size": [_LAUNCHER],
  "_next_instance_key": [_LAUNCHER],
  "_get_ordering_token": [_LAUNCHER],
  "_get_variable_creator_initial_value": [_MIRRORED_EXTENDED],
}
_INSTANCE_ATTRIBUTES = {
  "_variables",
  "_using_tpu",
  "_collective_ops",
  "_cross_device_ops",
  "_launchers",
  "_device",
  "_group_key",
  "_group_size",
}


def test_every_private_attribute_the_door_reads_is_checked_here():
  unchecked = tf_door.private_attributes(DOOR) - set(_PRIVATE_READS)
  assert not unchecked, (
    f"{WHERE} reads {sorted(unchecked)} off TF objects: add each to "
    "_PRIVATE_READS in this test with the TF classes that must have it."
  )


@pytest.mark.parametrize(
  "name", sorted(set(_PRIVATE_READS) - _INSTANCE_ATTRIBUTES)
)
def test_every_private_attribute_the_door_reads_exists(name):
  for cls in _PRIVATE_READS[name]:
    assert hasattr(cls, name), (
      f"{WHERE}: {cls.__module__}.{cls.__qualname__} has no {name!r} any "
      "more: a TF upgrade removed or renamed it; change the door (only it)."
    )


def test_the_instance_attributes_are_set_by_tf():
  """Instance attributes: some class of the TF classes' MRO assigns them."""
  for name in sorted(_INSTANCE_ATTRIBUTES):
    for cls in _PRIVATE_READS[name]:
      sources = [
        inspect.getsource(k)
        for k in cls.__mro__
        if k.__module__.startswith("tensorflow.")
      ]
      assert any(f"self.{name} =" in source for source in sources), (
        f"{WHERE}: {cls.__qualname__} no longer sets {name!r}: a TF upgrade "
        "renamed it; change the door (only it)."
      )


# The trackable protocol's methods that backends' classes override (a TF
# rename would leave the override dead, the checkpoint silently different).
_OVERRIDDEN = {
  "backends.mid_level.common.MidLevelBackend": [
    "_trackable_children",
    "_lookup_dependency",
  ],
  "backends.storage.row_sharded.RowShardedVariable": [
    "_serialize_to_tensors",
    "_restore_from_tensors",
  ],
}


@pytest.mark.parametrize("where", sorted(_OVERRIDDEN))
def test_the_protocol_methods_backends_override_are_tfs(where):
  module, name = where.rsplit(".", 1)
  cls = getattr(importlib.import_module(module), name)
  tf_bases = [k for k in cls.__mro__ if k.__module__.startswith("tensorflow.")]
  for method in _OVERRIDDEN[where]:
    assert method in vars(cls), f"{where} no longer overrides {method}"
    assert any(method in vars(k) for k in tf_bases), (
      f"{where} overrides {method!r}, which TF's trackable classes no longer "
      "define: a TF upgrade renamed it; the override is dead."
    )


# -- each question, where the answer is known -------------------------------


_BRANCHING = """
def sign(x):
  if x > 0:  # a tensor as a Python bool: only AutoGraph can trace it
    return 1
  return -1
"""


@pytest.mark.parametrize("package", ["backends", "recsys", "tests"])
def test_autograph_converts_what_the_project_calls_only_outside_it(
  package, monkeypatch, tmp_path
):
  """A function of the project's packages, called from a converted
  `tf.function`, is traced as written (a tensor used as a bool fails the
  trace); elsewhere AutoGraph converts it (the tensor becomes a tf.cond)."""
  source = tmp_path / "probe.py"  # AutoGraph converts what it can read
  source.write_text(_BRANCHING)
  name = f"{package}._autograph_probe"
  spec = importlib.util.spec_from_file_location(name, source)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setitem(sys.modules, name, module)
  step = tf.function(lambda x: module.sign(x))
  if package == "tests":
    assert step(tf.constant(2.0)).numpy() == 1
    assert step(tf.constant(-2.0)).numpy() == -1
  else:
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
      step(tf.constant(2.0))


def test_in_xla_context_only_in_a_compiled_function():
  seen = {}

  def probe(name):
    seen[name] = _tf_internal.in_xla_context()
    return tf.constant(0)

  probe("eager")
  tf.function(lambda: probe("graph"))()
  tf.function(lambda: probe("xla"), jit_compile=True)()
  assert seen == {"eager": False, "graph": False, "xla": True}


def test_tape_may_record_only_under_a_watching_tape():
  assert not _tf_internal.tape_may_record()
  with tf.GradientTape():
    assert _tf_internal.tape_may_record()
  tape = tf.GradientTape()
  with tape:
    with tape.stop_recording():
      assert not _tf_internal.tape_may_record()


def test_mark_variable_read_lets_a_watching_tape_take_the_variable():
  v = tf.Variable([1.0, 2.0])
  with tf.GradientTape() as tape:
    _tf_internal.mark_variable_read(v)
  assert [w.ref() for w in tape.watched_variables()] == [v.ref()]


def test_variable_shape_of_a_handle():
  v = tf.Variable(tf.zeros([5, 3]))
  assert _tf_internal.variable_shape(v.handle).numpy().tolist() == [5, 3]


def test_nest_helpers_tf_nest_lacks():
  config = {"b": [1, 2], "a": 3}
  assert _tf_internal.flatten_with_joined_string_paths(config) == [
    ("a", 3),
    ("b/0", 1),
    ("b/1", 2),
  ]
  assert _tf_internal.flatten_up_to(
    {"a": 0, "b": 0}, {"a": [1], "b": (2,)}
  ) == [
    [1],
    (2,),
  ]


@pytest.mark.parametrize(
  "optimizer, names",
  [
    (E.SGD(0.1), []),
    (E.Adagrad(0.1), ["accumulators"]),
    (E.Adam(0.1), ["momenta", "velocities"]),
    (E.FTRL(0.1), ["accumulators", "linears"]),
  ],
)
def test_optimizer_slots(optimizer, names):
  assert _tf_internal.slot_names(optimizer) == names
  assert len(_tf_internal.slot_initializers(optimizer)) == len(names)
  table = tf.Variable(tf.zeros([4, 2]))
  made = _tf_internal.create_slots(
    optimizer, table, lambda name, init: tf.Variable(init([4, 2], tf.float32))
  )
  assert sorted(made) == sorted(names)


def test_trackable_protocol():
  root = tf.Module()
  root.child = tf.Module()
  root.child.v = tf.Variable(1.0)
  children = _tf_internal.trackable_children(
    root, _tf_internal.SaveType.CHECKPOINT
  )
  assert children["child"] is root.child
  assert _tf_internal.lookup_dependency(root, "child") is root.child
  assert _tf_internal.deferred_restores(root.child) == {}
  objects, paths = _tf_internal.breadth_first_objects(root)
  assert [ref.name for ref in paths[root.child.v]] == ["child", "v"]
  assert root.child in objects
  assert _tf_internal.VARIABLE_VALUE_KEY == "VARIABLE_VALUE"
  assert issubclass(_tf_internal.AutoTrackable, _tf_internal.Trackable)
  assert isinstance(_tf_internal.NoDependency([]).value, list)


def test_deferred_restores_are_handed_to_the_object_that_creates_them(
  tmp_path,
):
  saved = tf.Module()
  saved.v = tf.Variable(7.0)
  path = tf.train.Checkpoint(m=saved).save(str(tmp_path / "c"))
  empty = _tf_internal.AutoTrackable()
  tf.train.Checkpoint(m=empty).restore(path)
  queued = _tf_internal.deferred_restores(empty)
  assert list(queued) == ["v"]
  empty.v = tf.Variable(0.0)  # created after the restore: restored now
  assert empty.v.numpy() == 7.0


def test_checkpoint_protos_and_keys():
  graph = _tf_internal.TrackableObjectGraph()
  node = graph.nodes.add()
  node.attributes.add(name="VARIABLE_VALUE", checkpoint_key="k")
  node.children.add(node_id=1, local_name="c")
  assert graph.nodes[0].attributes[0].checkpoint_key == "k"
  layouts = _tf_internal.SparseCoreTableLayouts()
  layouts.tables.add(table_name="t")
  assert layouts.tables[0].table_name == "t"
  assert isinstance(_tf_internal.SPARSECORE_LAYOUTS_CHECKPOINT_KEY, str)


def test_sharded_variable_and_restore_on_create():
  parts = [tf.Variable([[1.0]]), tf.Variable([[2.0]])]
  assert isinstance(
    _tf_internal.ShardedVariable(parts, name="t"), _tf_internal.ShardedVariable
  )
  info = _tf_internal.ShardInfo(shape=tf.TensorShape([1, 1]), offset=(1, 0))
  assert list(info.offset) == [1, 0]
  assert inspect.isclass(_tf_internal.CheckpointInitialValueCallable)


def test_register_checkpoint_saver_takes_what_the_door_passes():
  params = inspect.signature(
    importlib.import_module(
      "tensorflow.python.saved_model.registration"
    ).register_checkpoint_saver
  ).parameters
  door = inspect.signature(_tf_internal.register_checkpoint_saver).parameters
  assert set(door) <= set(params), (
    f"{WHERE}: register_checkpoint_saver no longer takes "
    f"{sorted(set(door) - set(params))}"
  )


def test_serving_mid_level_variables_and_engine():
  table = E.TableConfig(4, 2, name="t")
  mid = E.TPUEmbeddingForServing({"f": E.FeatureConfig(table)}, E.SGD(0.1))
  mid.build()
  variables = _tf_internal.mid_level_variables(mid)
  assert list(variables) == ["t"]
  assert variables["t"]["parameters"].shape == (4, 2)
  assert not _tf_internal.mid_level_on_tpu(mid)


def test_all_to_all_sends_row_i_to_replica_i():
  """2 and 4 CPU replicas in a traced step; one replica returns its input."""
  for replicas in (1, 2, 4):
    strategy = (
      mirrored_strategy(replicas)
      if replicas > 1
      else tf.distribute.get_strategy()
    )

    @tf.function
    def run(strategy=strategy, replicas=replicas):
      def step():
        ctx = tf.distribute.get_replica_context()
        me = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
        # Row i of replica r: 10 * r + i.
        sent = 10.0 * me + tf.range(replicas, dtype=tf.float32)[:, None]
        return _tf_internal.all_to_all(ctx, tf.tile(sent, [1, 3]))

      return strategy.experimental_local_results(strategy.run(step))

    for r, got in enumerate(run()):
      # Replica r receives row r of every replica i: 10 * i + r.
      want = (10.0 * np.arange(replicas) + r)[:, None] * np.ones((1, 3))
      np.testing.assert_array_equal(got.numpy(), want)


def test_summed_when_sums_over_the_replicas_only_where_the_condition_holds():
  """2 CPU replicas in a traced step (TF's collective inside a `tf.cond`),
  1 replica and eager (the replica context's all-reduce): where the
  condition holds the replicas' values summed; where not, zeros, and the
  value never computed (it would fail its assertion)."""
  spec = tf.TensorSpec([3], tf.float32)

  def step(condition):
    ctx = tf.distribute.get_replica_context()
    me = tf.cast(ctx.replica_id_in_sync_group, tf.float32)

    def value():
      check = tf.debugging.assert_equal(condition, True, message="computed")
      with tf.control_dependencies([check]):
        return me + tf.range(3, dtype=tf.float32)

    return _tf_internal.summed_when(ctx, condition, value, spec)

  for replicas, traced in ((1, True), (2, True), (2, False)):
    strategy = (
      mirrored_strategy(replicas)
      if replicas > 1
      else tf.distribute.get_strategy()
    )

    def run(condition, strategy=strategy):
      return strategy.experimental_local_results(
        strategy.run(step, args=(condition,))
      )

    run = tf.function(run) if traced else run
    summed = sum(range(replicas)) + replicas * np.arange(3)
    for condition, want in ((True, summed), (False, np.zeros(3))):
      for got in run(tf.constant(condition)):
        np.testing.assert_array_equal(got.numpy(), want)
