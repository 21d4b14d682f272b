"""What a training run tells its user: rates named for what they measure,
which kernels run, where evaluation data comes from, and no noise.

One small 2-replica run on a user's own `tf.data.Dataset` (the README's
Trainer example, no eval source) carries the behavioural checks.
"""

import functools
import logging
import warnings

import numpy as np
import pytest

from backends.tensorcore import kernels
from recsys._keras import tf
from recsys.models import DLRM
from recsys.run import run_summaries
from recsys.training.trainer import Trainer
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding


def test_throughput_names_the_steady_and_the_whole_run_rates(caplog):
  loops = [(100, 40.0), (100, 1.0), (100, 1.0)]  # the first loop traces
  caplog.set_level(logging.INFO, "recsys.training")
  rates = run_summaries.throughput(loops, 45.0, global_batch_size=64)
  assert rates["examples_per_second_steady"] == pytest.approx(200 * 64 / 2.0)
  assert rates["examples_per_second_whole_run"] == pytest.approx(300 * 64 / 45)
  assert "427 examples/s over the whole run" in caplog.text
  assert "6,400 examples/s steady" in caplog.text
  one = run_summaries.throughput([(50, 3.0)], 3.5, global_batch_size=10)
  assert one == {"examples_per_second_whole_run": pytest.approx(500 / 3.5)}
  assert "one loop only, so no steady rate" in caplog.text
  assert run_summaries.throughput([], 1.0, 10) == {}


@pytest.fixture(scope="module")
def two_replica_run(tmp_path_factory):
  """Trains 4 steps on 2 replicas; returns (metrics, log text, warnings)."""
  rng = np.random.default_rng(0)
  users, items = rng.integers(0, 23, 64), rng.integers(0, 11, 64)
  dataset = tf.data.Dataset.from_tensor_slices(
    ({"user": users, "item": items}, ((users + items) % 5).astype("float32"))
  )
  tables = {
    "user": E.TableConfig(23, 7, name="users"),
    "item": E.TableConfig(11, 7, name="items"),
  }
  handler = _Collect()
  logging.getLogger("recsys").addHandler(handler)
  logging.getLogger("recsys").setLevel(logging.INFO)
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      metrics = Trainer(
        str(tmp_path_factory.mktemp("run")),
        source=dataset,
        feature_config={k: E.FeatureConfig(t) for k, t in tables.items()},
        model=functools.partial(
          DLRM, objective="mse", bottom_mlp=(7,), top_mlp=(5,)
        ),
        strategy=mirrored_strategy(2),
        global_batch_size=16,
        train_steps=4,
        steps_per_loop=2,
        eval_steps=None,
        progress_bar=False,
        summaries=False,
      ).train()
  finally:
    logging.getLogger("recsys").removeHandler(handler)
  return metrics, "\n".join(handler.lines), [str(w.message) for w in caught]


class _Collect(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


def test_a_run_reports_both_rates(two_replica_run):
  metrics, text, _ = two_replica_run
  assert metrics["examples_per_second_steady"] > 0
  assert metrics["examples_per_second_whole_run"] > 0
  assert "examples_per_second" not in metrics  # one loop's rate: ambiguous
  assert "trained 4 steps in " in text


def test_a_run_without_eval_source_says_it_scores_the_training_data(
  two_replica_run,
):
  metrics, text, _ = two_replica_run
  assert "no eval_source: evaluation scores the training dataset" in text
  assert metrics["eval/examples"] == 64  # the training data, all of it


@pytest.mark.skipif(kernels.load() is None, reason="fused kernels unavailable")
def test_a_cpu_run_logs_that_it_runs_the_fused_kernels(two_replica_run):
  _, text, _ = two_replica_run
  assert "tensorcore: training steps run the fused CPU kernels" in text


def test_multi_replica_evaluation_warns_nothing(two_replica_run):
  _, _, caught = two_replica_run
  assert not [w for w in caught if "tf.data options" in w], caught
