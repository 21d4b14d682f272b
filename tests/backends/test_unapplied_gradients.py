"""No silent non-training: a training lookup whose gradients are never applied.

Every training backend refuses a second `lookup(..., training=True)` while
the previous one's gradients are still pending, eagerly and when a step is
traced, naming what to do; after the error the next step starts afresh.
"""

import pytest

import backends
from backends import pending
from recsys._keras import tf

E = tf.tpu.experimental.embedding


def make(name="tensorcore", strategy=None):
  table = E.TableConfig(23, 7, name="t")
  emb = backends.create(
    {"f": E.FeatureConfig(table)},
    E.Adagrad(0.1),
    strategy=strategy,
    backend=name,
  )
  emb.build()
  return emb


IDS = {"f": tf.constant([1, 2, 2], tf.int64)}


def train_step(emb, ids):
  """A training lookup followed by its apply_gradients."""
  with tf.GradientTape() as tape:
    acts = emb.lookup(ids, training=True)
    loss = tf.reduce_sum(acts["f"])
  emb.apply_gradients(tape.gradient(loss, acts))


TRAINING_BACKENDS = [
  n
  for n in backends.available(tf.distribute.get_strategy())
  if backends.get(n).capabilities.trains
]


@pytest.mark.parametrize("name", TRAINING_BACKENDS)
def test_eager_loop_that_forgets_apply_gradients_fails_at_its_second_step(name):
  """Every training backend that runs here (from its declared capabilities)."""
  emb = make(name)
  emb.lookup(IDS, training=True)
  with pytest.raises(
    pending.UnappliedGradientsError,
    match=r"never followed by apply_gradients.*recsys.layers.Embedding",
  ):
    emb.lookup(IDS, training=True)
  # One error, then a fresh start: a normal step works.
  train_step(emb, IDS)


def _forgetful_step(emb):
  """A traced training lookup never followed by `apply_gradients` (errors
  name the trace: "forgetful_step")."""

  @tf.function
  def forgetful_step(ids):
    return tf.reduce_sum(emb.lookup(ids, training=True)["f"])

  return forgetful_step


def test_traced_step_without_apply_fails_at_the_next_trace():
  emb = make()
  forgetful_step = _forgetful_step(emb)
  forgetful_step(IDS)
  with pytest.raises(pending.UnappliedGradientsError, match="while tracing"):
    forgetful_step({"f": tf.constant([[1, 2]], tf.int64)})  # a retrace


def _applied_step(emb):
  return tf.function(lambda ids: train_step(emb, ids))


def test_traced_step_without_apply_fails_at_its_second_call():
  """One trace runs many times: the runtime guard catches the second run."""
  emb = make()
  forgetful_step = _forgetful_step(emb)
  forgetful_step(IDS)
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"never followed by apply_gradients.*recsys.layers.Embedding",
  ):
    forgetful_step(IDS)  # the same trace
  # Another step's first trace still sees forgetful_step's trace (in
  # Python); after that one error, steps that apply their gradients run on.
  applied = _applied_step(emb)
  with pytest.raises(pending.UnappliedGradientsError, match="forgetful_step"):
    applied(IDS)
  for _ in range(3):
    applied(IDS)


def test_a_step_that_fails_in_its_lookup_leaves_no_pending_lookup():
  """A bad id fails the lookup before the guard is set: no follow-up error."""
  emb = make()
  applied = _applied_step(emb)
  applied(IDS)
  with pytest.raises(tf.errors.InvalidArgumentError, match="got id 99"):
    applied({"f": tf.constant([1, 99, 2], tf.int64)})
  applied(IDS)
  applied(IDS)


def test_evaluation_lookups_and_applied_steps_never_raise():
  emb = make()
  for _ in range(3):
    emb.lookup(IDS, training=False)
    train_step(emb, IDS)


def test_each_mirrored_replica_has_its_own_pending_lookup():
  from tests.conftest import mirrored_strategy  # pylint: disable=g-import-not-at-top

  strategy = mirrored_strategy(2)
  emb = make(strategy=strategy)

  @tf.function
  def step(ids):
    strategy.run(lambda i: train_step(emb, i), args=(ids,))

  step(IDS)
  step(IDS)

  @tf.function
  def forgetful(ids):
    strategy.run(lambda i: emb.lookup(i, training=True)["f"], args=(ids,))

  forgetful(IDS)
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="never followed by apply_gradients"
  ):
    forgetful(IDS)  # the same trace, each replica's guard set
  with pytest.raises(pending.UnappliedGradientsError):
    forgetful({"f": tf.constant([[1, 2]], tf.int64)})  # a retrace


def test_the_keras_layer_in_a_forward_pass_without_a_tape_does_not_train():
  """`model(x, training=True)` outside a tape is a forward pass, not a step."""
  from recsys import layers  # pylint: disable=g-import-not-at-top

  layer = layers.Embedding(
    {"f": E.FeatureConfig(E.TableConfig(23, 7, name="t"))}, E.Adagrad(0.1)
  )
  before = layer(IDS, training=True)["f"].numpy()
  after = layer(IDS, training=True)["f"].numpy()  # no error, nothing pending
  assert (before == after).all()
