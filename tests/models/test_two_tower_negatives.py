"""Corpus and mixed negatives of the two-tower model against NumPy references."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys._keras import keras
from recsys.errors import SettingsError
from recsys.models import LossInputs, TwoTower
from recsys.models.base import replica_loss
from recsys.models.retrieval import negatives as rn
from tests.models import reference
from tests.models.test_two_tower import B, _batch, _model

V = 29  # the "item" feature's vocabulary in test_two_tower.SPECS


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _corpus_reference(q, ids, table, filled, temperature):
  logits = q @ table.T / temperature
  logits = np.where(filled[None, :], logits, -np.inf)
  return -_log_softmax(logits)[np.arange(len(ids)), ids]


def _mixed_reference(q, c, ids, p, table, filled, sampled, temperature):
  """Loops over queries: the positive, in-batch negatives, sampled ones."""
  b, m = len(ids), len(sampled)
  out = []
  for i in range(b):
    logits = [q[i] @ c[i] / temperature - np.log(b * p[i])]
    for j in range(b):
      if j != i and ids[j] != ids[i]:
        logits.append(q[i] @ c[j] / temperature - np.log(b * p[j]))
    for s in sampled:
      if s != ids[i]:
        logits.append(q[i] @ table[s] / temperature - np.log(m / filled.sum()))
    logits = np.array(logits)
    out.append(-_log_softmax(logits)[0])
  return np.array(out)


def test_corpus_loss_matches_numpy():
  rng = np.random.default_rng(0)
  q = rng.normal(size=(4, 3)).astype(np.float32)
  table = rng.normal(size=(6, 3)).astype(np.float32)
  filled = np.array([False, True, True, False, True, True])
  ids = np.array([1, 4, 4, 5])
  got = rn.corpus_softmax_loss(q, ids, table, tf.constant(filled), 0.5)
  np.testing.assert_allclose(
    got.numpy(), _corpus_reference(q, ids, table, filled, 0.5), rtol=1e-5
  )


def test_mixed_loss_matches_numpy():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(5, 3)).astype(np.float32)
  c = rng.normal(size=(5, 3)).astype(np.float32)
  ids = np.array([2, 7, 2, 1, 4])  # an accidental hit: rows 0 and 2
  p = rng.uniform(0.01, 0.3, 5).astype(np.float32)
  table = rng.normal(size=(9, 3)).astype(np.float32)
  filled = np.array([0, 1, 1, 1, 1, 0, 1, 1, 1], bool)
  sampled = np.array([7, 3, 3, 8])  # 7 is row 1's positive: masked there
  got = rn.mixed_softmax_loss(
    q, c, ids, p, table, tf.constant(filled), sampled, temperature=0.2
  )
  want = _mixed_reference(q, c, ids, p, table, filled, sampled, 0.2)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)


def test_bank_fresh_rows_carry_gradients_once_per_id():
  bank = rn.CandidateBank(num_candidates=6, dim=2)
  bank.update(tf.constant([0, 5]), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
  fresh = tf.Variable([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0]])
  weights = np.arange(12, dtype=np.float32).reshape(6, 2)
  with tf.GradientTape() as tape:
    table, filled = bank.with_fresh(tf.constant([3, 5, 3]), fresh)
    total = tf.reduce_sum(table * weights)
  want = np.zeros((6, 2), np.float32)
  want[0] = [1, 2]
  want[3] = [1, 1]  # the first row of id 3
  want[5] = [2, 2]
  np.testing.assert_array_equal(table.numpy(), want)
  np.testing.assert_array_equal(filled.numpy(), [1, 0, 0, 1, 0, 1])
  grad = tf.convert_to_tensor(tape.gradient(total, fresh)).numpy()
  np.testing.assert_array_equal(grad, [weights[3], weights[5], [0, 0]])
  bank.update(tf.constant([3, 5, 3]), fresh)
  np.testing.assert_array_equal(bank.embeddings.numpy(), want)
  np.testing.assert_array_equal(bank.filled.numpy(), [1, 0, 0, 1, 0, 1])


def test_sampled_ids_are_filled_rows():
  filled = tf.constant([False, True, False, True, False])
  ids = rn.sample_filled(filled, 200).numpy()
  assert set(ids) == {1, 3}


def test_two_tower_corpus_loss_uses_the_bank_and_fills_it():
  model = _model(negatives="corpus", temperature=0.3)
  rng = np.random.default_rng(2)
  old = rng.normal(size=(V, 7)).astype(np.float32)
  old_ids = np.arange(1, V, 2)
  model.candidate_bank.update(old_ids, old[old_ids])
  acts, features = _batch(item_ids=[3, 8, 3, 10, 21])
  q = model.query_embeddings(acts).numpy()
  c = model.candidate_embeddings(acts).numpy()
  ids = features["categorical"]["item"]
  table = np.zeros((V, 7), np.float32)
  table[old_ids] = old[old_ids]
  # The fresh rows (ids 3 and 21 were in the bank); id 3's first row wins
  # (here its rows differ: the test's activations are random per row).
  table[ids[::-1]] = c[::-1]
  filled = np.zeros(V, bool)
  filled[old_ids] = filled[ids] = True
  want = _corpus_reference(q, ids, table, filled, 0.3) + (
    reference.in_batch_softmax_loss(q, c, ids=ids, temperature=0.3)
  )
  loss = replica_loss(
    model, model.per_example_loss(LossInputs(acts, features)), 2 * B
  )
  np.testing.assert_allclose(loss.numpy(), want.sum() / (2 * B), rtol=1e-5)
  np.testing.assert_allclose(
    model.candidate_bank.embeddings.numpy()[ids], table[ids], rtol=1e-6
  )
  # Evaluation keeps the in-batch loss and leaves the bank alone.
  before = model.candidate_bank.embeddings.numpy()
  model.compute_loss(
    LossInputs(acts, features, training=False, compute_metrics=False)
  )
  np.testing.assert_array_equal(model.candidate_bank.embeddings.numpy(), before)


def test_two_tower_mixed_loss_masks_copies_of_the_positive():
  """With every row a copy of the positive, every negative is masked."""
  model = _model(negatives="mixed", num_sampled_negatives=8)
  acts, features = _batch(item_ids=[4, 4, 4, 4, 4])
  loss = replica_loss(
    model, model.per_example_loss(LossInputs(acts, features)), B
  ).numpy()
  # Only id 4 is filled, so every negative is an accidental hit: loss 0.
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)


@pytest.mark.parametrize("negatives", ["corpus", "mixed"])
def test_corpus_term_trains_the_query_tower_only(negatives):
  """The candidate tower's gradients are the in-batch loss's alone.

  A candidate tower trained on the batch's fresh rows against stale bank
  rows learns to tell fresh from stale (measured on ml-100k: top-10 hit
  rate 0.003 against 0.060 in-batch), so the bank's term reaches the query.
  """
  model = _model(negatives=negatives, num_sampled_negatives=6)
  plain = _model()
  acts, features = _batch(item_ids=[3, 8, 3, 10, 21])
  model.query_embeddings(acts)
  model.candidate_embeddings(acts)
  plain.query_embeddings(acts)
  plain.candidate_embeddings(acts)
  plain.query_tower.set_weights(model.query_tower.get_weights())
  plain.candidate_tower.set_weights(model.candidate_tower.get_weights())
  rng = np.random.default_rng(3)
  model.candidate_bank.update(
    np.arange(V), rng.normal(size=(V, 7)).astype(np.float32)
  )
  grads = {}
  for name, m in (("bank", model), ("plain", plain)):
    with tf.GradientTape() as tape:
      loss = m.compute_loss(LossInputs(acts, features))
    variables = m.candidate_tower.trainable_variables
    variables += m.query_tower.trainable_variables
    grads[name] = [g.numpy() for g in tape.gradient(loss, variables)]
  n = len(model.candidate_tower.trainable_variables)
  for got, want in zip(grads["bank"][:n], grads["plain"][:n]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert any(
    not np.allclose(got, want)
    for got, want in zip(grads["bank"][n:], grads["plain"][n:])
  )


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(negatives="all"), "TwoTower.negatives must be one of"),
    (dict(negatives="mixed"), "num_sampled_negatives >= 1"),
    (dict(ignore_features=["zip"]), "not among the query"),
  ],
)
def test_config_errors(kwargs, message):
  with pytest.raises(SettingsError, match=message):
    _model(**kwargs)


def test_ignored_features_leave_the_towers():
  model = _model(ignore_features=["user"], query_tower=(7,))
  assert model.query_features == ["age"]
  acts, _ = _batch()
  assert model.query_tower.layers[0].weights == []
  model.query_embeddings(acts)
  assert model.query_tower.layers[0].weights[0].shape == (11, 7)


@pytest.mark.parametrize("negatives", ["corpus", "mixed"])
def test_fit_trains_with_corpus_negatives(negatives):
  """Under `model.fit` the bank fills with the batches' candidates."""
  from recsys.models.keras_model import KerasRecommender

  e = tf.tpu.experimental.embedding
  config = {
    "user": e.FeatureConfig(e.TableConfig(23, 8, name="users"), name="user"),
    "movie": e.FeatureConfig(e.TableConfig(29, 8, name="movies"), name="movie"),
  }
  model = KerasRecommender.build(
    TwoTower,
    config,
    e.Adagrad(0.1),
    query_features=["user"],
    candidate_features=["movie"],
    query_tower=(8,),
    candidate_tower=(8,),
    negatives=negatives,
    num_sampled_negatives=5,
  )
  model.compile(optimizer=keras.optimizers.Adam(0.01))
  rng = np.random.default_rng(0)
  movies = rng.integers(0, 29, 64)
  ds = tf.data.Dataset.from_tensor_slices(
    ({"user": rng.integers(0, 23, 64), "movie": movies}, np.ones(64))
  ).batch(8)
  history = model.fit(ds, epochs=3, verbose=0)
  assert np.isfinite(history.history["loss"]).all()
  assert history.history["loss"][-1] < history.history["loss"][0]
  filled = model.model.candidate_bank.filled.numpy()
  np.testing.assert_array_equal(np.flatnonzero(filled), np.unique(movies))


@pytest.mark.parametrize("negatives", ["corpus", "mixed"])
def test_corpus_loss_compiles_with_xla_like_the_eager_loss(negatives):
  # A TPU compiles the step: the bank's de-duplication must have static
  # shapes. One model, the same bank and batch, eager then compiled: the
  # same loss ("corpus"; "mixed" draws at random) and the same bank.
  acts, features = _batch(item_ids=[3, 8, 3, 10, 21])
  extra = {"num_sampled_negatives": 4} if negatives == "mixed" else {}
  model = _model(negatives=negatives, temperature=0.3, **extra)
  bank = model.candidate_bank
  results = []
  for jit in (False, True):
    bank.embeddings.assign(tf.zeros_like(bank.embeddings))
    bank.filled.assign(tf.zeros_like(bank.filled))
    bank.update(tf.constant([1, 3]), tf.ones([2, 7]))

    @tf.function(jit_compile=jit)
    def loss(acts, features):
      return replica_loss(
        model, model.per_example_loss(LossInputs(acts, features)), 2 * B
      )

    value = loss(acts, features).numpy()
    results.append((value, bank.embeddings.numpy(), bank.filled.numpy()))
  graph = loss.get_concrete_function(acts, features).graph
  dynamic = [
    (op.type, op.name)
    for op in graph.get_operations()
    for out in op.outputs
    if out.dtype != tf.resource and not out.shape.is_fully_defined()
  ]
  assert not dynamic, dynamic  # e.g. tf.unique's [U]: a TPU needs static
  (eager, eager_bank, eager_filled), (xla, xla_bank, xla_filled) = results
  assert np.isfinite(xla)
  np.testing.assert_allclose(xla_bank, eager_bank, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(xla_filled, eager_filled)
  assert eager_filled[[1, 3, 8, 10, 21]].all()
  if negatives == "corpus":
    np.testing.assert_allclose(xla, eager, rtol=1e-5)


def _bank_step(strategy, ids, embeddings, queries):
  """One step of the bank under `strategy`, the batch split over its
  replicas in order: the corpus term per example and the bank after."""
  with strategy.scope():
    bank = rn.CandidateBank(num_candidates=V, dim=3)
  bank.update(tf.constant([2, 5]), tf.fill([2, 3], 0.5))  # an earlier step
  parts = strategy.num_replicas_in_sync
  size = len(ids) // parts

  def local(value):
    return strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(
        value[ctx.replica_id_in_sync_group * size :][:size]
      )
    )

  @tf.function
  def step(ids, embeddings, queries):
    def replica(ids, embeddings, queries):
      table, filled = bank.with_fresh(ids, embeddings)
      per_example = rn.corpus_softmax_loss(queries, ids, table, filled, 0.5)
      bank.update(ids, embeddings)
      return per_example

    return strategy.run(replica, args=(ids, embeddings, queries))

  out = step(local(ids), local(embeddings), local(queries))
  per_example = np.concatenate(
    [t.numpy() for t in strategy.experimental_local_results(out)]
  )
  return per_example, bank.embeddings.numpy(), bank.filled.numpy()


def test_bank_on_two_replicas_equals_one_replica_on_the_global_batch():
  # Each replica's softmax sees every replica's fresh rows, and the bank
  # stores the whole step's (on every replica's copy); before, a mirrored
  # bank refused the scatter (NotImplementedError).
  from tests.conftest import mirrored_strategy

  rng = np.random.default_rng(3)
  ids = np.array([3, 8, 3, 10, 21, 8], np.int64)  # 3 and 8 on both replicas
  embeddings = rng.normal(size=(6, 3)).astype(np.float32)
  queries = rng.normal(size=(6, 3)).astype(np.float32)
  one = _bank_step(tf.distribute.get_strategy(), ids, embeddings, queries)
  two = _bank_step(mirrored_strategy(2), ids, embeddings, queries)
  np.testing.assert_allclose(two[0], one[0], rtol=1e-6)
  # The bank stores the rows it is given: exact on any replica count.
  np.testing.assert_array_equal(two[1], one[1])
  np.testing.assert_array_equal(two[2], one[2])
  assert set(np.flatnonzero(one[2])) == {2, 3, 5, 8, 10, 21}
  # The first row of each id wins, across replicas too (id 8: row 1).
  np.testing.assert_array_equal(one[1][8], embeddings[1])


@pytest.mark.parametrize("negatives", ["corpus", "mixed"])
def test_two_tower_corpus_negatives_train_on_two_replicas(negatives):
  from tests.conftest import mirrored_strategy

  strategy = mirrored_strategy(2)
  with strategy.scope():
    model = _model(negatives=negatives, num_sampled_negatives=3)
  acts, features = _batch(batch=6, item_ids=[3, 8, 3, 10, 21, 4])

  def local(tree):
    return strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.nest.map_structure(
        lambda v: tf.constant(v[ctx.replica_id_in_sync_group * 3 :][:3]), tree
      )
    )

  @tf.function
  def step(acts, features):
    return strategy.run(
      lambda a, f: replica_loss(
        model, model.per_example_loss(LossInputs(a, f)), 6
      ),
      args=(acts, features),
    )

  losses = strategy.experimental_local_results(
    step(local(acts), local(features))
  )
  assert all(np.isfinite(loss.numpy()) for loss in losses)
  for copy in model.candidate_bank.filled.values:
    np.testing.assert_array_equal(
      np.flatnonzero(copy.numpy()), [3, 4, 8, 10, 21]
    )
