"""Two-tower on N replicas == one replica on the same global batches.

In-batch and mixed negatives span the global batch (every replica's
candidates, `cross_replica_negatives=True`, the default): 2 mirrored CPU
replicas train the tables, slots, dense weights and the candidate bank of one
replica, and report its loss, uncompiled and on the static path. (4 replicas
gather the same way; `tests/backends` checks the tables on 4.)
With `cross_replica_negatives=False` each replica keeps its own negatives,
so 2 replicas train another model: the check above can fail.
"""

import functools

import numpy as np
import pytest

from recsys.data import SyntheticRetrieval
from recsys.features import EmbeddingSettings
from recsys.models import TwoTower
from recsys.training import Trainer
from tests.conftest import mirrored_strategy
from tests.training.test_trainer import embedding, state

GLOBAL_BATCH = 12
STEPS = 6


def _trainer(model_dir, replicas, negatives="in_batch", **kwargs):
  model = functools.partial(
    TwoTower,
    query_tower=(11, 7),
    candidate_tower=(11, 7),
    logq_correction=1.25,
    negatives=negatives,
    num_sampled_negatives=5 if negatives == "mixed" else 0,
    cross_replica_negatives=kwargs.pop("cross_replica_negatives", True),
  )
  return Trainer(
    str(model_dir),
    SyntheticRetrieval(
      num_users=23, num_items=17, num_examples=240, num_eval_examples=48
    ),
    model,
    strategy=mirrored_strategy(replicas),
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=embedding.Adagrad(0.1),
    global_batch_size=GLOBAL_BATCH,
    train_steps=STEPS,
    steps_per_loop=3,
    eval_steps=None,
    progress_bar=False,
    summaries=False,
    seed=5,
    **kwargs,
  )


def _run(model_dir, replicas, negatives="in_batch", **kwargs):
  trainer = _trainer(model_dir, replicas, negatives, **kwargs)
  metrics = trainer.train()
  values = state(trainer.run)
  bank = trainer.model.candidate_bank
  if bank is not None:
    values["bank/embeddings"] = bank.embeddings.numpy()
    values["bank/filled"] = bank.filled.numpy()
  return metrics, values


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory):
  """The reference runs: one replica, per negatives mode."""
  root = tmp_path_factory.mktemp("one")
  return {mode: _run(root / mode, 1, mode) for mode in ("in_batch", "mixed")}


def _assert_same(want, got):
  (want_metrics, want_state), (got_metrics, got_state) = want, got
  assert list(want_state) == list(got_state)
  for key, a in want_state.items():
    scale = max(1.0, float(np.abs(a).max()))
    np.testing.assert_allclose(
      got_state[key], a, rtol=1e-5, atol=1e-5 * scale, err_msg=key
    )
  for key in (
    "train/loss",
    "eval/loss",
    "eval/hit_rate/top_5_categorical_accuracy",
  ):
    np.testing.assert_allclose(
      got_metrics[key], want_metrics[key], rtol=1e-5, atol=1e-6, err_msg=key
    )


@pytest.mark.slow  # ~20 s a case on 2 cores: 6 steps and an evaluation
@pytest.mark.parametrize(
  "replicas,negatives,jit_compile",
  [
    # Each mode once; the static path (XLA cannot compile CPU collectives, so
    # static shapes run uncompiled) once. 4 replicas took 170 s in the suite
    # (4 replica threads on 2 busy cores) and prove nothing 2 do not.
    (2, "in_batch", False),
    (2, "mixed", True),
  ],
)
def test_replicas_train_the_one_replica_model(
  tmp_path, one_replica, replicas, negatives, jit_compile
):
  got = _run(tmp_path, replicas, negatives, jit_compile=jit_compile)
  _assert_same(one_replica[negatives], got)


@pytest.mark.slow
def test_per_replica_negatives_train_another_model(tmp_path, one_replica):
  _, per_replica = _run(tmp_path, 2, cross_replica_negatives=False)
  _, want = one_replica["in_batch"]
  key = next(k for k in want if k.startswith("table/"))
  assert not np.allclose(per_replica[key], want[key], rtol=1e-3, atol=1e-4)


def test_every_evaluation_of_a_run_embeds_the_corpus_with_one_function(
  tmp_path,
):
  """The candidate tower is traced for the full batch and the last partial
  one, once per run, not again at each evaluation (17 candidates in
  batches of 8: two shapes; 3 evaluations)."""
  trainer = _trainer(tmp_path, 1, eval_every=2, eval_batch_size=8)
  metrics = trainer.train()
  assert metrics["step"] == STEPS
  embed = trainer.run.evaluation.embed_candidates
  assert embed.experimental_get_tracing_count() == 2
  assert trainer.run.index_corpus() == 17
  assert embed.experimental_get_tracing_count() == 2
