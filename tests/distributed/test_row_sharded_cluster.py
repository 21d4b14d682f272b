"""Row-sharded tables across worker processes, with `recsys launch --ps 0`.

Every table row-sharded over a MultiWorkerMirroredStrategy of 2 worker
processes (one CPU replica each: TF's strategy takes one CPU device per
worker) by the shipped `experiments/hardware/local_cluster_row_sharded.gin`
(docs/scaling.md's command); SIGTERM to `recsys launch` after a checkpoint,
as a scheduler stops a job: the workers save a checkpoint at the step they
agree on (by slices, each worker its own rows), the launcher exits 143 and
no task outlives it (tests/distributed/test_launch_signals.py tests the
same with fake tasks); the cluster restarted with 3 workers resumes from
that checkpoint and ends where one process with one replica, tables
replicated, ends on the same global batches. That checkpoint then restores
by slices into 4 in-process replicas and into TF's own
`TPUEmbeddingForServing`, and each worker logged its peak RSS per phase.
The launcher printed worker 0's lines only; the others' are in the run's
`logs/`, appended launch after launch.
"""

import os
import re
import signal

import gin
import numpy as np
import pytest
import tensorflow as tf

from backends import checkpoint as checkpoint_lib
from backends.layout import TableLayout
from backends.storage import row_sharded_checkpoint
from backends.tensorcore.backend import TensorCoreEmbedding
from recsys import cli
from tests.conftest import mirrored_strategy
from tests.distributed import test_cluster as cluster_case
from tests.distributed.test_launch_signals import _alive

E = tf.tpu.experimental.embedding
STEPS = 8
GIN = [
  "SyntheticCTR.vocab_sizes = (40, 24, 60)",
  "SyntheticCTR.multi_hot_sizes = (1, 3, 1)",
  "SyntheticCTR.num_dense = 3",
  "SyntheticCTR.num_examples = 720",
  "SyntheticCTR.num_eval_examples = 48",
  "SyntheticCTR.oracle_examples = 4096",  # each worker's Bayes AUC: unread
  "EmbeddingSettings.dim = 4",
  "DLRM.bottom_mlp = (8, 4)",
  "DLRM.top_mlp = (8,)",
  "train.global_batch_size = 24",  # 1, 2, 3 and 4 replicas split it
  f"train.train_steps = {STEPS}",
  "train.steps_per_loop = 2",
  "train.checkpoint_every = 2",
  "train.eval_steps = 2",
  "train.summaries = False",
]
#: Every table row-sharded over the workers: the shipped file.
SHARDED = ["experiments/hardware/local_cluster_row_sharded.gin"]


def _args(model_dir, bindings, gin_files=()):
  args = ["--gin_file", "experiments/synthetic_dlrm.gin", "--no_progress"]
  args += ["--verbosity", "info"]  # the tests read checkpoint and RSS lines
  for path in gin_files:
    args += ["--gin_file", path]
  for binding in bindings:
    args += ["--gin_bindings", binding]
  return args + ["--model_dir", str(model_dir)]


def _gin(steps):
  """GIN, training `steps` steps (the math does not depend on them)."""
  return [b for b in GIN if not b.startswith("train.train_steps")] + [
    f"train.train_steps = {steps}"
  ]


def _launch(model_dir, workers, steps=STEPS):
  """A `recsys launch --ps 0` of the sharded run (`test_cluster._Launch`)."""
  cmd = cluster_case._launch_cmd(model_dir, workers=workers, ps=0)  # pylint: disable=protected-access
  cmd = cmd[: cmd.index("train") + 1] + _args(model_dir, _gin(steps), SHARDED)
  return cluster_case._Launch(model_dir, cmd)  # pylint: disable=protected-access


def _embedding_tensors(model_dir):
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
  return {
    key: reader.get_tensor(key)
    for key in reader.get_variable_to_shape_map()
    if key.startswith(("embedding/", "model/")) and "ATTRIBUTES" in key
  }


@pytest.mark.slow
def test_two_processes_stopped_then_three_end_as_one_process(tmp_path):
  model_dir = tmp_path / "cluster"
  # Steps it cannot reach before the SIGTERM: the stop decides where it ends.
  with _launch(model_dir, workers=2, steps=1000) as first:
    pids = [
      int(first.read_until(rf"\[launch\] worker {i} pid (\d+)", 60).group(1))
      for i in (0, 1)
    ]
    first.read_until(r"\[worker 0\].*saved checkpoint .*ckpt-4\b", 300)
    first.proc.send_signal(signal.SIGTERM)  # to `recsys launch`
    stopped = first.read_until(
      r"\[worker 0\].*SIGTERM received: saved checkpoint \S*ckpt-(\d+) at", 60
    )
    code = first.finish(timeout=60)
    assert code == 143, first.log[-6000:]
  assert "every task has ended (status 143)" in first.log, first.log[-3000:]
  assert not [pid for pid in pids if _alive(pid)], first.log[-3000:]
  stop_step = int(stopped.group(1))
  saved = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  assert saved.endswith(f"ckpt-{stop_step}") and stop_step >= 4, saved
  # Written by slices: each worker its own rows, merged by the chief.
  assert row_sharded_checkpoint.sliced_keys(saved)
  steps = max(STEPS, stop_step + 2)  # the resumed run trains some steps
  with _launch(model_dir, workers=3, steps=steps) as second:
    resumed = second.read_until(r"restored .*ckpt-(\d+) at step", 300)
    assert int(resumed.group(1)) == stop_step
    code = second.finish(timeout=400)
    assert code == 0, second.log[-6000:]
  peaks = re.findall(
    r"\[worker (\d)\].*peak RSS of this process: (.*)", second.log
  )
  assert [w for w, _ in peaks] == ["0"], second.log[-3000:]
  assert all("save" in p and "restore" in p for _, p in peaks)
  # One set of lines, worker 0's: the others' are in logs/, both launches'.
  others = [line for line in second.lines if re.match(r"\[worker [12]\]", line)]
  assert not others, others
  logs = model_dir / "logs"
  assert sorted(os.listdir(logs)) == ["worker-1.log", "worker-2.log"]
  first_and_second = (logs / "worker-1.log").read_text()
  assert first_and_second.count("--- recsys launch ") == 2
  assert (logs / "worker-2.log").read_text().startswith("--- recsys launch ")

  # The same global batches in this process, one replica, replicated.
  one = tmp_path / "one"
  gin.clear_config()
  assert cli.main(["train", *_args(one, _gin(steps))]) == 0
  gin.clear_config()
  want, got = _embedding_tensors(one), _embedding_tensors(model_dir)
  assert sorted(want) == sorted(got) and len(want) > 9
  for key, value in want.items():
    scale = max(1.0, float(np.abs(value).max()))
    np.testing.assert_allclose(
      got[key], value, rtol=1e-4, atol=1e-4 * scale, err_msg=key
    )

  # The cluster's checkpoint by slices into 4 replicas, and into TF's own
  # serving embedding (which reads each table whole).
  tables = [
    E.TableConfig(v, 4, name=f"C{i + 1}") for i, v in enumerate((40, 24, 60))
  ]
  config = {t.name: E.FeatureConfig(t) for t in tables}
  strategy = mirrored_strategy(4)
  with strategy.scope():
    four = TensorCoreEmbedding(
      config, E.Adam(0.01), strategy, layouts=TableLayout("row_sharded")
    )
    four.build()
  path = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  checkpoint_lib.restore(four, path)
  serving = E.TPUEmbeddingForServing(config, E.SGD(0.1))
  serving.build()
  tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
  for table in tables:
    key = f"embedding/{table.name}/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(
      tf.convert_to_tensor(four.embedding_tables[table]).numpy(), got[key]
    )
    np.testing.assert_array_equal(
      serving.embedding_tables[table].numpy(), got[key]
    )
