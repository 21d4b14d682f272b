"""recsys/_tf_internal.py against the TensorFlow installed: each question it
answers, asked where the answer is known both ways, so an upgrade that moves
what one of them reads fails here and not inside the Keras layer."""

import os

import pytest

from recsys import _tf_internal
from recsys._keras import keras, tf  # Keras 2 before TF


def test_tape_is_recording_only_under_a_watching_tape():
  assert not _tf_internal.tape_is_recording()
  with tf.GradientTape():
    assert _tf_internal.tape_is_recording()
  tape = tf.GradientTape()
  with tape:
    with tape.stop_recording():
      assert not _tf_internal.tape_is_recording()


def test_in_xla_compilation_only_in_a_compiled_function():
  seen = {}

  def probe(name):
    seen[name] = _tf_internal.in_xla_compilation()
    return tf.constant(0)

  probe("eager")
  tf.function(lambda: probe("graph"))()
  tf.function(lambda: probe("xla"), jit_compile=True)()
  assert seen == {"eager": False, "graph": False, "xla": True}


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


def test_gradient_request_sees_the_sources_of_the_running_gradient_call():
  a, b = tf.Variable(1.0), tf.Variable(2.0)
  requests = []

  @tf.custom_gradient
  def spy(x):
    def grad(dy):
      requests.append(_tf_internal.current_gradient_request())
      return dy

    return tf.identity(x), grad

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
