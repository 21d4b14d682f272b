"""recsys/_tf_internal.py against the TensorFlow installed: each question it
answers, asked where the answer is known both ways, and every symbol and
private attribute it takes from TF (read from its source), so an upgrade
that moves what one of them reads fails here, naming it, and not inside the
Keras layer. And the rule that makes each door the one place: no module of
`recsys/` or `backends/` but its package's door imports `tensorflow.python`
or `tensorflow.core`."""

import os
import pathlib
import sys

import pytest

from backends import _tf_internal as backends_door
from recsys import _tf_internal
from recsys._keras import keras, tf  # Keras 2 before TF
from tests import tf_door


def test_the_shared_questions_are_the_backends_doors():
  # tests/backends/test_tf_internal.py asks them where the answer is known.
  assert _tf_internal.tape_is_recording is backends_door.tape_may_record
  assert _tf_internal.in_xla_compilation is backends_door.in_xla_context
  for name in (
    "flatten_with_joined_string_paths",
    "flatten_up_to",
    "NoDependency",
  ):
    assert getattr(_tf_internal, name) is getattr(backends_door, name)


def test_in_saved_model_trace_only_while_saving(tmp_path):
  seen = []

  class Module(tf.Module):
    @tf.function(input_signature=[])
    def serve(self):
      seen.append(_tf_internal.in_saved_model_trace())
      return tf.constant(1)

  module = Module()
  module.serve()  # traced outside a save
  tf.saved_model.save(
    module, os.path.join(tmp_path, "m"), signatures={"s": module.serve}
  )
  assert seen[0] is False
  assert True in seen[1:]


def _request_spy(requests):
  """The identity, whose gradient appends the running gradient request (or
  None) to `requests`."""

  @tf.custom_gradient
  def spy(x):
    def grad(dy):
      requests.append(_tf_internal.current_gradient_request())
      return dy

    return tf.identity(x), grad

  return spy


def test_gradient_request_sees_the_sources_of_the_running_gradient_call():
  a, b = tf.Variable(1.0), tf.Variable(2.0)
  requests = []
  spy = _request_spy(requests)

  with tf.GradientTape(persistent=True) as tape:
    loss = spy(a * b)
  tape.gradient(loss, [a])
  tape.gradient(loss, {"b": b})
  del tape
  first, second = requests
  assert first.persistent and second.persistent
  assert first.covers(a) and not first.covers(b)
  assert second.covers(b) and not second.covers(a)
  assert _tf_internal.current_gradient_request() is None


def test_gradient_request_covers_a_wrapper_sharing_the_handle():
  """Keras's mixed-precision AutoCastVariable shares its variable's handle."""
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    layer = keras.layers.Dense(1)
    layer.build([None, 1])
  finally:
    keras.mixed_precision.set_global_policy("float32")
  wrapped = layer.kernel  # an AutoCastVariable
  inner = wrapped._variable  # pylint: disable=protected-access
  assert wrapped is not inner
  request = _tf_internal.GradientRequest([wrapped], persistent=False)
  assert request.covers(inner)
  assert not request.covers(tf.Variable([[0.0]]))
  assert not request.covers(tf.constant(1.0))


def test_gradient_request_names_the_keras_loss_scaler_it_runs_under():
  """Keras's `minimize` scales the loss; a `train_step` that differentiates
  it itself (tfrs.Model's) has not, unless it called `get_scaled_loss`;
  a plain optimizer or a bare tape has no loss scaler."""
  variable = tf.Variable(1.0)
  requests = []
  spy = _request_spy(requests)

  def loss():
    return spy(variable) * 2.0

  for inner in (keras.optimizers.SGD(0.1), keras.optimizers.legacy.SGD(0.1)):
    scaling = keras.mixed_precision.LossScaleOptimizer(inner)
    scaling.minimize(loss, [variable])
    assert requests[-1].loss_scaler.optimizer is scaling
    assert requests[-1].loss_scaler.loss_is_scaled
  keras.optimizers.SGD(0.1).minimize(loss, [variable])
  assert requests[-1].loss_scaler is None

  class Model(keras.Model):
    def __init__(self, scale_by_hand):
      super().__init__()
      self.scale_by_hand = scale_by_hand

    def train_step(self, data):
      with tf.GradientTape() as tape:
        target = loss()
        if self.scale_by_hand:
          target = self.optimizer.get_scaled_loss(target)
      tape.gradient(target, [variable])
      return {}

  for by_hand in (False, True):
    model = Model(by_hand)
    model.compile(
      optimizer=keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)
      )
    )
    model.train_step(None)
    assert requests[-1].loss_scaler.optimizer is model.optimizer
    assert requests[-1].loss_scaler.loss_is_scaled is by_hand
  with tf.GradientTape() as tape:
    target = loss()
  tape.gradient(target, [variable])
  assert requests[-1].loss_scaler is None


def test_mirrored_strategies_collect_under_keys_of_their_own():
  # Two TF MirroredStrategies in one process number their collectives alike,
  # so one's all-gather of 3 values meets the other's of 5 and aborts every
  # collective in the process; the helper's strategies never meet.
  cpus = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
  if len(cpus) < 2:
    pytest.skip("needs 2 logical CPUs")
  first = _tf_internal.mirrored_strategy(cpus)
  second = _tf_internal.mirrored_strategy(cpus)

  def gathered(strategy, size):
    @tf.function
    def gather():
      ctx = lambda: tf.distribute.get_replica_context()  # noqa: E731
      return strategy.run(lambda: ctx().all_gather(tf.ones([size]), axis=0))

    return [t.shape[0] for t in strategy.experimental_local_results(gather())]

  assert gathered(first, 3) == [6, 6]
  assert gathered(second, 5) == [10, 10]
  assert gathered(first, 3) == [6, 6]


def test_keras_learning_rate_reads_the_variable_a_step_reads():
  legacy = keras.optimizers.legacy.SGD(0.25, decay=0.5)
  schedule, decay = _tf_internal.keras_learning_rate(legacy, legacy=True)
  assert isinstance(schedule, tf.Variable)  # made now, not at the first step
  assert float(schedule.numpy()) == 0.25 and decay == 0.5
  legacy.learning_rate = 0.5  # what a callback does: the variable changes
  assert float(schedule.numpy()) == 0.5
  new = keras.optimizers.SGD(0.125)
  schedule, decay = _tf_internal.keras_learning_rate(new, legacy=False)
  assert float(tf.convert_to_tensor(schedule).numpy()) == 0.125
  assert decay == 0.0


# -- what the door takes from TF, read from its source ----------------------

DOOR = pathlib.Path(_tf_internal.__file__)
WHERE = "recsys/_tf_internal.py"


def test_the_door_takes_something_from_tf():
  assert "tensorflow.python.saved_model.save_context.in_save_context" in (
    tf_door.tf_symbols(DOOR)
  )


@pytest.mark.parametrize("symbol", tf_door.tf_symbols(DOOR))
def test_every_tf_symbol_the_door_takes_exists(symbol):
  tf_door.check_symbol_exists(symbol, WHERE)


def _private_owners():
  """Each private attribute the door reads, on the objects it reads it off
  (instances where TF or Keras sets it in `__init__`)."""
  return {
    "_getframe": [sys],
    "_collective_key_base": [tf.distribute.MirroredStrategy],
    "_persistent": [tf.GradientTape()],
    "_create_hypers": [keras.optimizers.legacy.SGD(0.1)],
    "_hyper": [keras.optimizers.legacy.SGD(0.1)],
    "_initial_decay": [keras.optimizers.legacy.SGD(0.1)],
    "_learning_rate": [keras.optimizers.SGD(0.1)],
    "_loss_has_been_scaled": [
      keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
      keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.legacy.SGD(0.1)
      ),
    ],
  }


def test_every_private_attribute_the_door_reads_is_checked_here():
  unchecked = tf_door.private_attributes(DOOR) - set(_private_owners())
  assert not unchecked, (
    f"{WHERE} reads {sorted(unchecked)} off TF/Keras objects: add each to "
    "_private_owners in this test with the objects that must have it."
  )


def test_every_private_attribute_the_door_reads_exists():
  for name, owners in _private_owners().items():
    for owner in owners:
      assert hasattr(owner, name), (
        f"{WHERE}: {owner!r} has no {name!r} any more: a TF or Keras upgrade "
        "removed or renamed it; change the door (only it)."
      )


# -- one door per package ----------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOORS = {
  "backends": "backends/_tf_internal.py",
  "recsys": "recsys/_tf_internal.py",
}


@pytest.mark.parametrize("package", sorted(DOORS))
def test_only_the_door_imports_tf_private_modules(package):
  """`tensorflow.python` / `tensorflow.core` are imported by the package's
  door alone, so a TF upgrade's private surface is one file per package."""
  offenders = []
  for path in sorted((ROOT / package).rglob("*.py")):
    relative = path.relative_to(ROOT).as_posix()
    if relative == DOORS[package]:
      continue
    offenders += [
      f"{relative}:{line}: {module}"
      for line, module in tf_door.private_tf_imports(path)
    ]
  assert not offenders, (
    f"private TF imports outside {DOORS[package]} (move each behind it as a "
    "named function or symbol, or use the public tf API):\n"
    + "\n".join(offenders)
  )


def test_the_scan_sees_every_form_of_import(tmp_path):
  path = tmp_path / "m.py"
  path.write_text(
    "import tensorflow.python.ops\n"
    "from tensorflow.core.framework import summary_pb2\n"
    "from tensorflow import python\n"
    "def f():\n"
    "  from tensorflow.python.util import nest\n"
    "  importlib.import_module('tensorflow.python.eager.record')\n"
    "import tensorflow as tf\n"
    "from tensorflow.tpu.experimental import embedding\n"
    "x = 'tensorflow.python.tpu'\n"
  )
  assert [line for line, _ in tf_door.private_tf_imports(path)] == [
    1,
    2,
    3,
    5,
    6,
  ]
