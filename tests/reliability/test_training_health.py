"""NaN/inf steps (stop or skip), and one run per model dir."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from recsys.model_dir import lock as lock_lib
from recsys.model_dir.checkpoints import CorruptCheckpointError
from recsys.training import trainer as trainer_lib
from tests.training import test_trainer
from tests.training.few_steps import few_steps
from tests.training.sources import ArraySource


class PoisonedSource(ArraySource):
  """ArraySource whose training batch number `bad` has NaN dense features."""

  def __init__(self, bad: int):
    super().__init__()
    self.bad = bad

  def dataset(self, batch_size, *, training=True, **kwargs):
    ds = super().dataset(batch_size, training=training, **kwargs)
    if not training:
      return ds
    bad = self.bad

    def poison(i, batch):
      features, labels = batch
      features = dict(features)
      nan = tf.fill(tf.shape(features["dense"]), float("nan"))
      features["dense"] = tf.where(i == bad, nan, features["dense"])
      return features, labels

    return ds.enumerate().map(poison)


def make(model_dir, bad, **kwargs):
  settings = few_steps(
    train_steps=12,
    steps_per_loop=4,
    seed=3,
    checkpoint_every=4,
    max_checkpoints=10,
  )
  settings.update(kwargs)
  return trainer_lib.Trainer(
    str(model_dir),
    PoisonedSource(bad),
    test_trainer.MODEL,
    embedding=test_trainer.EmbeddingSettings(dim=7),
    embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
    **settings,
  )


def checkpoint_values(path):
  """A checkpoint's training state: not its step counters or the streaming
  training metrics (those see every batch, and restart each loop)."""
  reader = tf.train.load_checkpoint(path)
  return {
    k: reader.get_tensor(k)
    for k in reader.get_variable_to_shape_map()
    if "OBJECT_GRAPH" not in k
    and not k.startswith("step/")
    and "save_counter" not in k
    and "metrics" not in k
  }


def test_stop_names_the_step_and_the_last_good_checkpoint(tmp_path):
  trainer = make(tmp_path, bad=6)  # batch 6 is read by step 7
  with pytest.raises(trainer_lib.NonFiniteLossError) as info:
    trainer.train()
  err = info.value
  assert err.step == 7
  assert err.last_checkpoint.endswith("ckpt-4")
  assert "step 7" in str(err) and "batch 6" in str(err) and "ckpt-4" in str(err)
  assert "nonfinite_policy" in str(err)
  # Nothing after the last good checkpoint was saved; the loop stopped at 6.
  assert trainer.run.checkpoints.manager.latest_checkpoint.endswith("ckpt-4")
  assert int(trainer.run.global_step.numpy()) == 6


def test_skip_leaves_the_step_out_and_counts_it(tmp_path):
  trainer = make(
    tmp_path,
    bad=6,
    nonfinite_policy="skip",
    steps_per_loop=1,
    checkpoint_every=1,
    train_steps=9,
  )
  metrics = trainer.train()
  assert metrics["train/nonfinite_steps"] == 1
  assert metrics["step"] == 9 and np.isfinite(metrics["train/loss"])
  ckpt = os.path.join(str(tmp_path), "checkpoints", "ckpt-{}")
  before, skipped, after = (
    checkpoint_values(ckpt.format(s)) for s in (6, 7, 8)
  )
  assert sorted(before) == sorted(skipped)
  for key in before:  # tables, slots, dense weights, Adam moments, iterations
    np.testing.assert_array_equal(before[key], skipped[key], err_msg=key)
  assert any(not np.array_equal(skipped[k], after[k]) for k in skipped)


def test_unknown_policy_is_refused(tmp_path):
  with pytest.raises(
    ValueError, match="nonfinite_policy must be one of 'stop', 'skip'"
  ):
    make(tmp_path, bad=0, nonfinite_policy="sometimes")


def test_a_second_run_in_the_same_model_dir_is_refused(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from recsys.model_dir.lock import ModelDirLock; "
      "ModelDirLock(sys.argv[1]).acquire(); print('held', flush=True); "
      "time.sleep(120)",
      str(tmp_path),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    trainer = make(tmp_path, bad=-1, train_steps=4)
    with pytest.raises(
      lock_lib.ModelDirBusyError,
      match=f"pid {holder.pid} .*another --model_dir",
    ):
      trainer.train()
    assert (
      trainer.run.checkpoints.manager.latest_checkpoint is None
    )  # nothing written
    holder.kill()  # SIGKILL: the kernel releases the lock, no stale file
    holder.wait(timeout=30)
    assert trainer.train()["step"] == 4
  finally:
    holder.kill()
    holder.wait(timeout=30)


def test_lock_is_exclusive_and_released():
  import tempfile  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as d:
    with lock_lib.ModelDirLock(d):
      with pytest.raises(
        lock_lib.ModelDirBusyError, match=f"pid {os.getpid()}"
      ):
        lock_lib.ModelDirLock(d).acquire()
    lock_lib.ModelDirLock(d).acquire().release()


def test_cli_exits_143_after_a_preemption_checkpoint(monkeypatch, capsys):
  from recsys import cli  # pylint: disable=g-import-not-at-top
  from recsys.training import signals  # pylint: disable=g-import-not-at-top

  def preempted(args):
    raise signals.TrainingPreempted(7, f"{args.model_dir}/ckpt-7", "SIGTERM")

  monkeypatch.setattr(cli.COMMANDS["train"], "run", preempted)
  code = cli.main(
    [
      "train",
      "--gin_file",
      "experiments/synthetic_dlrm.gin",
      "--model_dir",
      "/tmp/run",
    ]
  )
  assert code == 143
  err = capsys.readouterr().err
  assert "SIGTERM received: saved checkpoint /tmp/run/ckpt-7 at step 7" in err
  assert "run the same command again to resume" in err


def test_no_readable_checkpoint_is_an_error_naming_them(tmp_path):
  make(tmp_path, bad=-1, train_steps=2, checkpoint_every=1).train()
  folder = tmp_path / "checkpoints"
  for name in os.listdir(folder):
    if ".data-" in name:
      with open(folder / name, "r+b") as f:
        f.truncate(3)
  with pytest.raises(
    CorruptCheckpointError,
    match="ckpt-2: .*ckpt-1: .*Move the directory aside",
  ):
    make(tmp_path, bad=-1, train_steps=2)
  assert sorted(n for n in os.listdir(folder) if n.endswith(".index")) == [
    "ckpt-1.index",
    "ckpt-2.index",
  ]  # nothing deleted
