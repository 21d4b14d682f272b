"""ImplicitALS against the benchmark's NumPy iALS (synthetic data only).

The solve math alone, then the model trained through the tensorcore
backend the way the Trainer steps (lookup under a tape, the model's loss,
`apply_gradients` with SGD(1.0)): the same initial tables and settings give
the NumPy iALS's tables after 1 and 3 epochs, to float32 rounding.
"""

import numpy as np
import pytest
import tensorflow as tf

import backends
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends.layout import TableLayout
from benchmarks import ials_scale
from benchmarks import movielens_baselines as baselines
from recsys import features as features_lib
from recsys.data import ials_batches, ials_dataset, ials_plan
from recsys.errors import SettingsError
from recsys.models.errors import ModelConfigError
from recsys.models.retrieval import ials, ials_solve
from tests.conftest import mirrored_strategy

embedding = tf.tpu.experimental.embedding
NUM_USERS, NUM_ITEMS, DIM = 40, 30, 6  # ids 1..N, row 0 is the OOV row
REG, ALPHA = 3.0, 10.0


def _pairs(seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  users = rng.integers(1, NUM_USERS + 1, 300)
  items = rng.integers(1, NUM_ITEMS + 1, 300)
  return np.stack([users, items], 1)


# The shipped file's kind of settings: frequency-scaled regularization
# (nu = 1) and an unobserved weight other than 1.
RENDLE = {
  "reg": 0.05,
  "alpha": 3.0,
  "unobserved_weight": 0.5,
  "reg_exponent": 1.0,
}


def _numpy_ials(pairs, p, q, epochs, **weights):
  """The benchmark's iALS half-steps from given initial tables."""
  weights = weights or {"reg": REG, "alpha": ALPHA}
  pairs = ials_batches.unique_pairs(pairs, NUM_USERS + 1, NUM_ITEMS + 1)
  by_user = baselines._rows_by_key(pairs[:, 0], pairs[:, 1], NUM_USERS + 1)
  by_item = baselines._rows_by_key(pairs[:, 1], pairs[:, 0], NUM_ITEMS + 1)
  for _ in range(epochs):
    p = baselines._ials_half_step(q, by_user, **weights)
    q = baselines._ials_half_step(p, by_item, **weights)
  return p, q


def test_solve_rows_is_the_numpy_half_step():
  rng = np.random.default_rng(1)
  q = rng.normal(0, 0.3, (NUM_ITEMS + 1, DIM))
  pairs = ials_batches.unique_pairs(_pairs(), NUM_USERS + 1, NUM_ITEMS + 1)
  by_user = baselines._rows_by_key(pairs[:, 0], pairs[:, 1], NUM_USERS + 1)
  expected = baselines._ials_half_step(q, by_user, REG, ALPHA)
  longest = max(len(h) for h in by_user)
  history = np.zeros((NUM_USERS + 1, longest, DIM))
  for u, h in enumerate(by_user):
    history[u, : len(h)] = q[h]
  counts = np.array([len(h) for h in by_user])
  got = ials_solve.solve_rows(
    ials_solve.gramian(tf.constant(q, tf.float32)),
    tf.constant(history, tf.float32),
    ials_solve.row_regularization(counts, REG, ALPHA, 1.0, 0.0, NUM_ITEMS + 1),
    ALPHA,
    1.0,
  )
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_frequency_scaled_regularization():
  got = ials_solve.row_regularization(
    np.array([0, 4]), 2.0, 3.0, 0.5, 1.0, 10
  ).numpy()
  np.testing.assert_allclose(got, [2.0 * 5.0, 2.0 * 17.0])


def _setup(
  strategy, batch_size, optimizer=None, chunk=None, weights=None, **options
):
  pairs = _pairs()
  specs = ials_batches.feature_specs(
    pairs, NUM_USERS + 1, NUM_ITEMS + 1, history_chunk=chunk
  )
  settings = features_lib.EmbeddingSettings(
    dim=DIM,
    optimizer=optimizer or embedding.SGD(1.0),
    initializer=tf.random_normal_initializer(0.0, 0.3, seed=3),
  )
  config = features_lib.feature_config(specs, settings)
  tf.keras.utils.set_random_seed(2)
  with strategy.scope():
    backend = backends.create(
      config, settings.optimizer, strategy, backend="tensorcore", **options
    )
    backend.build()
    model = ials.ImplicitALS(
      specs, dim=DIM, **(weights or {"reg": REG, "alpha": ALPHA})
    )
  return pairs, config, backend, model


def _epoch(pairs, batch_size, replicas=1, chunk=None) -> list:
  return list(
    ials_dataset.epoch_batches(
      pairs,
      NUM_USERS + 1,
      NUM_ITEMS + 1,
      batch_size,
      steps_multiple=replicas,
      history_chunk=chunk,
    )
  )


def _steps(strategy, step, batches) -> None:
  """Consecutive batches to consecutive replicas, as one input pipeline
  feeds them."""
  replicas = strategy.num_replicas_in_sync
  for start in range(0, len(batches), replicas):
    if replicas == 1:
      step(*batches[start])
      continue
    group = batches[start : start + replicas]
    step(
      *strategy.experimental_distribute_values_from_function(
        lambda ctx, group=group: group[ctx.replica_id_in_sync_group]
      )
    )


def _tables(backend) -> dict:
  return {
    t.name: tf.convert_to_tensor(v).numpy()
    for t, v in backend.embedding_tables.items()
  }


def _train(
  strategy,
  batch_size,
  epochs,
  chunk=None,
  weights=None,
  jit_compile=False,
  **options,
):
  pairs, config, backend, model = _setup(
    strategy, batch_size, chunk=chunk, weights=weights, **options
  )
  ials.check_embedding_optimizer(config)
  # The benchmark's step: what it times is what this test checks.
  step = ials_scale.ials_step(
    strategy, backend, model, list(config), jit_compile=jit_compile
  )
  initial = _tables(backend)
  replicas = strategy.num_replicas_in_sync
  for _ in range(epochs):
    _steps(strategy, step, _epoch(pairs, batch_size, replicas, chunk))
  return pairs, initial, _tables(backend), backend


@pytest.mark.parametrize(
  "epochs, chunk, jit_compile",
  [
    (1, None, False),
    (3, None, False),
    (1, 3, False),
    (3, 3, False),
  ],
  ids=["1-whole", "3-whole", "1-chunks_of_3", "3-chunks_of_3"],
)
def test_model_through_backend_matches_numpy_ials(epochs, chunk, jit_compile):
  """Histories cut into chunks of 3 ids (most rows of this data span
  several entries) solve to the same tables as whole histories (compiled
  by XLA: `test_rows_longer_than_a_batch_solve_as_numpy_ials_compiled`)."""
  pairs, initial, trained, _ = _train(
    tf.distribute.get_strategy(),
    16,
    epochs,
    chunk=chunk,
    jit_compile=jit_compile,
  )
  p, q = _numpy_ials(pairs, initial["user"], initial["item"], epochs)
  np.testing.assert_allclose(trained["user"], p, rtol=2e-4, atol=2e-6)
  np.testing.assert_allclose(trained["item"], q, rtol=2e-4, atol=2e-6)


def test_rows_longer_than_a_batch_solve_as_numpy_ials_compiled():
  """Chunks of 2 ids and 4 entries a batch: every row with more than 8
  pairs (most items, some users) is solved over whole steps of its own,
  its sums added over its steps; the tables are the NumPy iALS's all the
  same, the step compiled by XLA (the path a TPU runs). Not compiled: the
  CLI run of `tests/test_ials_run.py`; over 2 and 4 replicas:
  `test_replicas_train_the_one_replica_tables`."""
  pairs, initial, trained, _ = _train(
    tf.distribute.get_strategy(), 4, 2, chunk=2, jit_compile=True
  )
  plan = ials_plan.plan_epoch(pairs, NUM_USERS + 1, NUM_ITEMS + 1, 4, 1, 2)
  long_sides = {ials_batches.USER_LONG, ials_batches.ITEM_LONG}
  assert long_sides <= set(plan.entries.side.tolist())
  p, q = _numpy_ials(pairs, initial["user"], initial["item"], 2)
  np.testing.assert_allclose(trained["user"], p, rtol=2e-4, atol=2e-6)
  np.testing.assert_allclose(trained["item"], q, rtol=2e-4, atol=2e-6)


def test_frequency_scaled_weights_through_backend_match_numpy_ials():
  """Rendle et al.'s weights (w0 != 1, lambda_u = reg (alpha |I_u| + w0
  |I|)) give the NumPy iALS's tables with the same weights, and other
  tables than the plain weights do."""
  pairs, initial, trained, _ = _train(
    tf.distribute.get_strategy(), 16, 2, weights=RENDLE
  )
  p, q = _numpy_ials(pairs, initial["user"], initial["item"], 2, **RENDLE)
  np.testing.assert_allclose(trained["user"], p, rtol=2e-4, atol=2e-6)
  np.testing.assert_allclose(trained["item"], q, rtol=2e-4, atol=2e-6)
  plain, _ = _numpy_ials(pairs, initial["user"], initial["item"], 2)
  assert not np.allclose(p, plain, atol=1e-3)


def _counted_sums(monkeypatch, strategy) -> tf.Variable:
  """A count of the runs of the value `ImplicitALS._add_to_sums` sums over
  the replicas (`summed_when`), a copy a replica (one shared variable would
  chain the replicas' steps: a deadlock at their collective)."""
  with strategy.scope():
    runs = tf.Variable(
      0,
      dtype=tf.int64,
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
    )
  summed_when = ials._tf_internal.summed_when

  def counted(context, condition, value_fn, spec):
    def value():
      with tf.control_dependencies([runs.assign_add(1)]):
        return tf.identity(value_fn())

    return summed_when(context, condition, value, spec)

  monkeypatch.setattr(ials._tf_internal, "summed_when", counted)
  return runs


@pytest.mark.slow
@pytest.mark.parametrize(
  "replicas, placement",
  [(2, "replicated"), (2, "row_sharded"), (4, "row_sharded")],
  ids=["2_replicated", "2_row_sharded", "4_row_sharded"],
)
def test_replicas_train_the_one_replica_tables(
  replicas, placement, monkeypatch
):
  """Each replica solves its own distinct rows (consecutive batches) with
  the Gramian its share of the other table adds to: the tables of one
  replica on batches `replicas` times the size, row-sharded too, with the
  histories cut into chunks (of 1 id on 2 replicas, 2 on 4): the rows
  longer than a batch's entries (8 or 4 of them) solved in steps of their
  own, their sums added over the replicas. Those sums are computed and
  all-reduced on the Gramian and long-row steps only, never on a solve
  step (counted). Compiled steps: on one replica
  (`test_rows_longer_than_a_batch_solve_as_numpy_ials_compiled`); a CPU
  MirroredStrategy cannot run collectives inside XLA."""
  _, _, one, _ = _train(tf.distribute.get_strategy(), 16, 1)
  strategy = mirrored_strategy(replicas)
  runs = _counted_sums(monkeypatch, strategy)
  chunk = 1 if replicas == 2 else 2  # rows longer than a batch holds
  _, _, many, backend = _train(
    strategy, 16 // replicas, 1, chunk=chunk, layouts=TableLayout(placement)
  )
  assert set(backend.placements().values()) == {placement}
  plan = ials_plan.plan_epoch(
    _pairs(), NUM_USERS + 1, NUM_ITEMS + 1, 16 // replicas, replicas, chunk
  )
  long_row_steps = {ials_batches.USER_LONG + ials_batches.RESTART}
  assert long_row_steps <= set(plan.entries.side.tolist())
  for name in one:
    np.testing.assert_allclose(many[name], one[name], rtol=1e-5, atol=1e-6)
  kinds = plan.step_kinds(replicas)
  summed_steps = int(np.isin(kinds, ials_batches.SUMMED_KINDS).sum())
  assert 0 < summed_steps < len(kinds)
  assert np.isin(kinds, [ials_batches.USER_SIDE, ials_batches.ITEM_SIDE]).any()
  assert runs.read_value().numpy() == replicas * summed_steps


def test_gramian_batches_hold_each_row_once_each_replica_its_strided_share():
  parts = ials_plan.gramian_parts(
    other_rows=103, batch_size=4, width=3, steps_multiple=4
  )
  # 103 ids at 4 * 3 a batch and 4 batches a step: 3 steps.
  assert len(parts) == 12
  assert sorted(np.concatenate(parts).tolist()) == list(range(103))
  for index, part in enumerate(parts):
    assert len(part) <= 4 * 3
    assert (part % 4 == index % 4).all()
  # In an epoch: user u saw item u (histories of 1 id: 16 ids a step).
  pairs = np.stack([np.arange(103)] * 2, 1)
  batches = list(
    ials_dataset.epoch_batches(pairs, 103, 103, 4, steps_multiple=4)
  )
  parts = ials_plan.gramian_parts(103, 4, 1, 4)  # 7 steps
  item_half = 28 + 28  # the item Gramian's, the users' 26 -> 28 batches
  sides = [int(f[ials_batches.SIDE][0]) for f, _ in batches]
  assert sides[item_half : item_half + 29] == [5] * 4 + [3] * 24 + [1]
  for part, (features, _) in zip(parts, batches[item_half:]):
    categorical = features["categorical"]
    assert categorical[ials_batches.ITEM_HISTORY].to_list() == [
      p.tolist() for p in np.array_split(part, 4)
    ]
    assert categorical[ials_batches.USER_HISTORY].to_list() == [[]] * 4


@pytest.mark.parametrize("replicas", [2, 4])
def test_each_batch_solves_rows_of_every_owner_evenly(replicas):
  """The solved rows alone carry gradients (the update sends no others),
  so each batch's must spread over the owners of a row-sharded table
  under either layout, as the exchange sizes its buckets for an even
  share: at most one more than it, per contiguous shard and per residue
  mod R (rows in id order would give one owner the whole batch)."""
  rows = 1001
  pairs = np.stack([np.arange(rows), np.arange(rows) % 7], 1)
  batch = 64
  plan = ials_plan.plan_epoch(pairs, rows, 7, batch, replicas)
  entries = plan.entries
  solves = entries.side.reshape(-1, batch) == ials_batches.USER_SIDE
  solved = entries.row.reshape(-1, batch)
  assert sorted(solved[solves].tolist()) == list(range(rows))
  shard = -(-rows // replicas)
  for batch_rows in (solved[i][solves[i]] for i in range(len(solved))):
    even = -(-len(batch_rows) // replicas)
    for owner_of in (batch_rows // shard, batch_rows % replicas):
      counts = np.bincount(owner_of, minlength=replicas)
      assert counts.max() <= even + 1, (counts, even)


def test_resumed_in_the_middle_of_a_long_row_solves_with_the_saved_sums(
  tmp_path,
):
  """Stopped in the user half, after its Gramian step, its other rows'
  solves and the first of a long row's steps, saved, restored into a new
  model and backend: the rest of the epoch gives the tables of an
  uninterrupted one (bit for bit), and without the saved sums (the
  model's Gramians and long-row sums) it would not."""
  strategy = tf.distribute.get_strategy()
  batch_size, chunk = 2, 2
  batches = None
  results = {}
  for mode in ("straight", "resumed", "sums_lost"):
    pairs, config, backend, model = _setup(strategy, batch_size, chunk=chunk)
    step = ials_scale.ials_step(strategy, backend, model, list(config))
    batches = batches or _epoch(pairs, batch_size, chunk=chunk)
    sides = [int(f[ials_batches.SIDE][0]) for f, _ in batches]
    assert sides[0] >= ials_batches.ITEM_GRAMIAN
    assert ials_batches.USER_SIDE in sides
    # Between a long user row's first and second steps.
    stop = sides.index(ials_batches.USER_LONG)
    assert sides[stop - 1] == ials_batches.USER_LONG + ials_batches.RESTART
    if mode == "straight":
      _steps(strategy, step, batches)
      results[mode] = _tables(backend)
      continue
    _steps(strategy, step, batches[:stop])
    path = tf.train.Checkpoint(model=model, backend=backend).save(
      str(tmp_path / mode / "ckpt")
    )
    pairs, config, backend, model = _setup(strategy, batch_size, chunk=chunk)
    checkpoint = tf.train.Checkpoint(model=model, backend=backend)
    if mode == "sums_lost":
      checkpoint = tf.train.Checkpoint(backend=backend)
    checkpoint.restore(path).expect_partial()
    step = ials_scale.ials_step(strategy, backend, model, list(config))
    _steps(strategy, step, batches[stop:])
    results[mode] = _tables(backend)
  for name, table in results["straight"].items():
    np.testing.assert_array_equal(results["resumed"][name], table)
  assert not np.allclose(
    results["sums_lost"]["user"], results["straight"]["user"]
  )


def test_refuses_a_step_that_mixes_kinds_of_batch():
  strategy = mirrored_strategy(2)
  pairs, config, backend, model = _setup(strategy, 8)
  step = ials_scale.ials_step(strategy, backend, model, list(config))
  batches = _epoch(pairs, 8, replicas=1)
  kinds = [int(f[ials_batches.SIDE][0]) for f, _ in batches]
  assert kinds[0] >= ials_batches.ITEM_GRAMIAN  # one Gramian batch...
  assert kinds[1] == ials_batches.USER_SIDE  # ... then the user solves
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="steps_multiple to the number"
  ):
    _steps(strategy, step, batches[:2])


def test_refuses_an_optimizer_other_than_sgd_1():
  _, config, _, _ = _setup(
    tf.distribute.get_strategy(), 16, embedding.Adagrad(0.1)
  )
  with pytest.raises(ModelConfigError, match="table 'user'.*SGD"):
    ials.check_embedding_optimizer(config)
  _, config, _, _ = _setup(tf.distribute.get_strategy(), 16, embedding.SGD(0.5))
  with pytest.raises(ModelConfigError, match="learning rate 1.0"):
    ials.check_embedding_optimizer(config)


def test_chunked_rows_share_one_batch_and_point_at_their_first_entry():
  lengths = (0, 5, 2, 7, 1)  # user u saw items 0 .. lengths[u] - 1
  pairs = np.array([[u, i] for u, n in enumerate(lengths) for i in range(n)])
  batches = list(ials_dataset.epoch_batches(pairs, 5, 8, 4, history_chunk=3))
  # The item Gramian (8 items fit 4 entries of 3), then the users:
  # entries per row 1, 2, 1, 3, 1 -> packed in order, none split.
  users = [f["categorical"]["user"].numpy().tolist() for f, _ in batches[1:3]]
  assert users == [[0, 1, 1, 2], [3, 3, 3, 4]]
  features, _ = batches[2]
  assert features[ials_batches.SEGMENT].numpy().tolist() == [0, 0, 0, 3]
  assert features[ials_batches.COUNTS].numpy().tolist() == [7, 7, 7, 1]
  history = features["categorical"][ials_batches.USER_HISTORY]
  assert history.to_list() == [[0, 1, 2], [3, 4, 5], [6], [0]]
  plan = ials_plan.plan_epoch(
    np.array([[1, 1]]), 5, 8, 4, steps_multiple=2, history_chunk=3
  )
  assert plan.num_batches == 2 * (2 + 2)  # a half: 2 Gramian, 2 solves


def test_a_row_longer_than_a_batch_takes_whole_steps_of_its_own():
  """User 3's 7 items in chunks of 3 need 3 entries, more than a batch of
  2 holds: after the other users' batches, 2 steps hold its chunks (then
  padding), the first restarting the sums; the last step's first entry
  carries the row and its count. On 2 replicas its 3 chunks fit one step
  of 2 batches."""
  lengths = (0, 5, 2, 7, 1)
  pairs = np.array([[u, i] for u, n in enumerate(lengths) for i in range(n)])
  plan = ials_plan.plan_epoch(pairs, 5, 8, 2, history_chunk=3)
  entries = plan.entries
  restart = ials_batches.USER_LONG + ials_batches.RESTART
  long_user = np.flatnonzero(
    np.isin(entries.side, [restart, ials_batches.USER_LONG])
  )
  assert entries.side[long_user].tolist() == [restart] * 2 + [6] * 2
  assert entries.row[long_user].tolist() == [0, 0, 3, 0]
  assert entries.counts[long_user].tolist() == [0, 0, 7, 0]
  histories = [
    plan.ids[s : s + n].tolist()
    for s, n in zip(entries.starts[long_user], entries.lengths[long_user])
  ]
  # Step s of 2 holds chunks s, s + 2, ...: each step spans the history.
  assert histories == [[0, 1, 2], [6], [3, 4, 5], []]
  # Every other row fits a batch and is solved there, once.
  short = entries.side == ials_batches.USER_SIDE
  assert sorted(set(entries.row[short].tolist())) == [0, 1, 2, 4]
  # Two replicas: one step, its two batches all long entries.
  plan = ials_plan.plan_epoch(pairs, 5, 8, 2, 2, history_chunk=3)
  sides = plan.entries.side.reshape(plan.num_batches, 2)
  first_long = int(np.flatnonzero(sides[:, 0] == restart)[0])
  assert (sides[first_long : first_long + 2] == restart).all()
  assert not np.isin(sides[first_long + 2 :], [6, restart]).any()
  assert plan.entries.row[first_long * 2] == 3


def _as_lists(features: dict) -> dict:
  """A batch's features as nested lists (ragged ones too), to compare."""
  flat = {**features["categorical"], **features}
  del flat["categorical"]
  return {
    k: v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist()
    for k, v in flat.items()
  }


def test_input_pipelines_read_the_batches_of_their_replicas():
  """Pipeline p of P feeds replicas [p R/P, (p+1) R/P) of each step: read
  in turn, the pipelines give the one pipeline's batches."""
  plan = ials_plan.plan_epoch(_pairs(), NUM_USERS + 1, NUM_ITEMS + 1, 4, 4)
  whole = list(ials_dataset.epoch_dataset(plan, steps_multiple=4))
  shares = [
    list(
      ials_dataset.epoch_dataset(
        plan, pipeline=p, pipelines=2, steps_multiple=4
      )
    )
    for p in range(2)
  ]
  merged = []
  for step in range(len(whole) // 4):
    for p in range(2):
      merged += shares[p][2 * step : 2 * step + 2]
  assert [_as_lists(f) for f, _ in merged] == [_as_lists(f) for f, _ in whole]
  with pytest.raises(ials_dataset.PipelinesError, match="steps_multiple = 4"):
    ials_dataset.epoch_dataset(plan, pipelines=3, steps_multiple=4)


def test_refuses_bad_settings():
  specs = ials_batches.feature_specs(_pairs(), NUM_USERS + 1, NUM_ITEMS + 1)
  with pytest.raises(SettingsError, match="ImplicitALS.reg must be > 0"):
    ials.ImplicitALS(specs, reg=0.0)
