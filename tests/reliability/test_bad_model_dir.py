"""A model dir that holds another run's checkpoint (or is not a folder at all).

`backends.checkpoint.verify_compatible` already names the embedding tables
that differ (tests/backends/test_checkpoints.py); here the same run is
restored through the real entry point, the `Trainer`, with each part of the
configuration changed in turn, and `backends.checkpoint.verify_objects`
checks every other variable (model layers, dense optimizer slots) against
Keras models and TF's own restore.
"""

import contextlib
import functools
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import checkpoint as ckpt  # noqa: E402
from recsys import cli, config  # noqa: E402
from recsys._keras import keras  # noqa: E402
from recsys.features import EmbeddingSettings  # noqa: E402
from recsys.models import DLRM, DCNv2  # noqa: E402
from recsys.training import Trainer  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402
from tests.training.few_steps import few_steps  # noqa: E402
from tests.training.sources import ArraySource  # noqa: E402

E = tf.tpu.experimental.embedding


def make_trainer(
  model_dir,
  dim=7,
  vocab=23,
  top_mlp=(11,),
  model=None,
  optimizer=None,
  dense=None,
):
  return Trainer(
    str(model_dir),
    ArraySource(vocab=vocab),
    model or functools.partial(DLRM, bottom_mlp=(11, dim), top_mlp=top_mlp),
    embedding=EmbeddingSettings(dim=dim),
    embedding_optimizer=optimizer or E.Adagrad(0.1),
    dense_optimizer=dense,
    **few_steps(),
  )


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("run") / "model"
  make_trainer(model_dir).train()
  return model_dir


@pytest.fixture
def other_run(trained_dir, tmp_path):
  """A copy of the trained run's model dir, for one test to point a run at."""
  copy = tmp_path / "model"
  shutil.copytree(trained_dir, copy)
  return copy


# -- through the Trainer -------------------------------------------------------


def test_the_same_configuration_resumes(other_run):
  assert make_trainer(other_run).run.restored_step == 2


@pytest.mark.parametrize(
  "change,match",
  [
    (
      dict(dim=8),
      r"table 'user': checkpoint shape \[23, 7\], backend shape \[23, 8\]",
    ),
    (
      dict(vocab=29),
      r"table 'tags': checkpoint shape \[23, 7\], backend shape \[29, 7\]",
    ),
    (
      dict(optimizer=E.Adam(0.1)),
      r"table 'user': the backend's optimizer Adam has "
      r"slots \['momenta', 'velocities'\], "
      r"the checkpoint has \['accumulators'\]",
    ),
  ],
)
def test_another_embedding_configuration_names_the_table(
  other_run, change, match
):
  with pytest.raises(ckpt.CheckpointMismatchError, match=match):
    make_trainer(other_run, **change)


def test_a_checkpoint_of_something_else(tmp_path):
  model_dir = tmp_path / "model"
  foreign = tf.train.Checkpoint(weights=tf.Variable(tf.zeros([3])))
  tf.train.CheckpointManager(foreign, str(model_dir / "checkpoints"), 1).save()
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"has no variables under 'embedding/'; its top-level "
    r"objects are .*'weights'",
  ):
    make_trainer(model_dir)


@pytest.mark.parametrize(
  "change,match",
  [
    (
      dict(top_mlp=(13,)),
      r"model/top_mlp/.*checkpoint shape \[11\], this run \[13\]",
    ),
    (dict(model=DCNv2), r"model/.* is not in the checkpoint"),
    (dict(dense=keras.optimizers.SGD), r"optimizer/.*checkpoint shape"),
  ],
  ids=["top_mlp", "another_model", "another_dense_optimizer"],
)
def test_another_model_or_dense_optimizer_lists_what_differs(
  other_run, change, match
):
  with pytest.raises(ckpt.CheckpointMismatchError, match=match):
    make_trainer(other_run, **change)


def test_verify_objects_on_the_trainers_checkpoint(other_run, tmp_path):
  """What Trainer.restore would report, on its real object graph."""
  path = str(other_run / "checkpoints")
  same = make_trainer(tmp_path / "fresh")
  assert ckpt.verify_objects(path, same.run.checkpoints.checkpoint).endswith(
    "ckpt-2"
  )
  wider = make_trainer(tmp_path / "wider", top_mlp=(13,))
  with pytest.raises(ckpt.CheckpointMismatchError) as info:
    ckpt.verify_objects(path, wider.run.checkpoints.checkpoint)
  message = str(info.value)
  assert (
    "model/top_mlp/layer_with_weights-0/bias: "
    "checkpoint shape [11], this run [13]" in message
  )
  assert "embedding" not in message


def test_a_model_dir_that_is_a_file(tmp_path):
  model_dir = tmp_path / "model"
  model_dir.write_text("not a folder")
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(
    "include 'base.gin'\ntrain.data = @SyntheticCTR()\n"
    "SyntheticCTR.vocab_sizes = (23,)\nSyntheticCTR.multi_hot_sizes = (1,)\n"
    "SyntheticCTR.oracle_examples = 1024\ntrain.model = @DLRM\n"
  )
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.main(
      ["train", "--gin_file", str(gin_file), "--model_dir", str(model_dir)]
    )
  assert code == 2 and str(model_dir) in err.getvalue()  # a setting: 2


# -- a model dir this user may not write ---------------------------------------

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
TINY = [
  "train.global_batch_size = 64",
  "train.steps_per_loop = 1",
  "train.eval_steps = 1",
  "SyntheticCTR.oracle_examples = 1024",
  "train.progress_bar = False",
]


def _unprivileged(probe):
  """A command prefix under which file modes apply to a child process (root
  ignores them): none for a user; for root, a user namespace where it is an
  ordinary user owning its files; None when neither is possible here."""
  if os.geteuid() != 0:
    return []
  prefix = ["unshare", "--user", "--map-user=1000"]
  try:
    done = subprocess.run(
      [*prefix, "touch", os.path.join(probe, "x")],
      capture_output=True,
      timeout=30,
    )
  except (OSError, subprocess.TimeoutExpired):
    return None
  denied = done.returncode != 0 and b"Permission denied" in done.stderr
  return prefix if denied else None


def _set_writable(path, writable):
  for folder, _, files in os.walk(path):
    for name in [folder, *(os.path.join(folder, f) for f in files)]:
      mode = os.stat(name).st_mode
      os.chmod(name, mode | 0o200 if writable else mode & ~0o222)


@pytest.mark.slow
def test_a_resume_in_a_read_only_model_dir_is_refused_naming_it(tmp_path):
  """`recsys train` on a read-only run used to start up and restore, then
  fail with a raw PermissionDeniedError from the summary writer."""
  run = tmp_path / "run"
  default = os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")
  args = ["train", "--gin_file", default, "--model_dir", str(run)]
  for binding in TINY:
    args += ["--gin_bindings", binding]
  assert cli.main([*args, "--gin_bindings", "train.train_steps = 2"]) == 0
  _set_writable(run, False)
  try:
    prefix = _unprivileged(str(run))
    if prefix is None:
      pytest.skip("cannot run a process that read-only modes apply to")
    done = subprocess.run(
      [*prefix, sys.executable, "-m", "recsys", *args],
      cwd=ROOT,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
      capture_output=True,
      text=True,
      timeout=300,
    )
  finally:
    _set_writable(run, True)
  assert done.returncode == 1, done.stderr
  assert (
    f"recsys train: ModelDirNotWritableError: model dir {str(run)!r} is not "
    "writable by this user"
  ) in done.stderr
  assert "chmod" in done.stderr and "copy" in done.stderr  # what to do
  assert "restored" not in done.stderr  # refused before the restore
  assert "PermissionDenied" not in done.stderr


# -- verify_objects against Keras models and TF's restore ----------------------


def keras_run(widths, optimizer=keras.optimizers.Adam, strategy=None):
  """A built Keras MLP and optimizer in a `tf.train.Checkpoint`, one table."""
  strategy = strategy or tf.distribute.get_strategy()
  with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(w) for w in widths])
    model.build([None, 5])
    opt = optimizer()
    opt.build(model.trainable_variables)
    table = tf.Variable(tf.zeros([11, 3]))
  return tf.train.Checkpoint(model=model, optimizer=opt, embedding=table)


def saved(tmp_path, widths, **kwargs):
  checkpoint = keras_run(widths, **kwargs)
  return checkpoint.save(str(tmp_path / "ckpt"))


def test_verify_objects_accepts_the_same_configuration(tmp_path):
  path = saved(tmp_path, (7, 1))
  assert ckpt.verify_objects(str(tmp_path), keras_run((7, 1))) == path
  keras_run((7, 1)).restore(path).assert_existing_objects_matched()  # TF agrees


def test_verify_objects_accepts_mirrored_variables(tmp_path):
  path = saved(tmp_path, (7, 1))
  assert (
    ckpt.verify_objects(path, keras_run((7, 1), strategy=mirrored_strategy(2)))
    == path
  )


def test_verify_objects_lists_every_shape_that_differs(tmp_path):
  path = saved(tmp_path, (7, 1))
  run = keras_run((9, 1))
  with pytest.raises(
    ValueError, match="incompatible tensor"
  ):  # TF: the first only
    run.restore(path)
  with pytest.raises(ckpt.CheckpointMismatchError) as info:
    ckpt.verify_objects(path, keras_run((9, 1)), hint="Use a new --model_dir.")
  message = str(info.value)
  assert (
    "model/layer_with_weights-0/kernel: "
    "checkpoint shape [5, 7], this run [5, 9]" in message
  )
  assert (
    "model/layer_with_weights-0/bias: checkpoint shape [7], this run [9]"
    in message
  )
  assert (
    "model/layer_with_weights-1/kernel: "
    "checkpoint shape [7, 1], this run [9, 1]" in message
  )
  assert "optimizer/" in message and message.endswith("Use a new --model_dir.")


def test_verify_objects_finds_layers_on_either_side_only(tmp_path):
  path = saved(tmp_path, (7, 1))
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"model/layer_with_weights-2/kernel \[1, 4\] is not in the "
    "checkpoint",
  ):
    ckpt.verify_objects(path, keras_run((7, 1, 4)))
  smaller = tmp_path / "smaller"
  path = saved(smaller, (7, 1, 4))
  run = keras_run((7, 1))
  run.restore(path).assert_existing_objects_matched()  # TF: silently partial
  with pytest.raises(
    ckpt.CheckpointMismatchError,
    match=r"model/layer_with_weights-2/kernel \[1, 4\] is in the "
    "checkpoint but not in this run",
  ):
    ckpt.verify_objects(path, run)


def test_verify_objects_skips_the_embedding_and_names_another_optimizer(
  tmp_path,
):
  path = saved(tmp_path, (7, 1))
  run = keras_run((7, 1), optimizer=keras.optimizers.SGD)
  with tf.device("/cpu:0"):
    run.embedding.assign(tf.ones([11, 3]))
  with pytest.raises(ckpt.CheckpointMismatchError) as info:
    ckpt.verify_objects(path, run)
  message = str(info.value)
  assert "embedding" not in message and "model/" not in message
  assert (
    "optimizer/" in message
    and "in the checkpoint but not in this run" in message
  )
  np.testing.assert_array_equal(run.embedding.numpy(), np.ones([11, 3]))


def test_verify_objects_without_a_checkpoint(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint in directory"):
    ckpt.verify_objects(str(tmp_path), keras_run((7, 1)))
