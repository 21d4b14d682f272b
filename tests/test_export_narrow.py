"""A run trained with bfloat16 tables, from the user's side: train, export,
serve, evaluate and resume with another `table_dtype`, through the CLI.

References: the bfloat16 tables as the checkpoint holds them (the export's
float32 tables must be exactly their values), and the training backend's
own lookups of those tables (the served scores must be the model's).
"""

import json
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli, config
from tests.cli_runs import DEFAULT, flags, tiny

TINY = tiny(train_steps=4, steps_per_loop=2, eval_steps=2, summaries=False)
BF16 = 'EmbeddingPlacement.table_dtype = "bfloat16"'
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _train(model_dir, *bindings):
  bound = flags(TINY + list(bindings))
  argv = ["train", "--gin_file", DEFAULT, *bound, "--model_dir", model_dir]
  try:
    return cli.main(argv + ["--no_progress"])
  finally:
    gin.clear_config()


def _tables(path, prefix):
  """`{table: (dtype, value)}` of a checkpoint's (or SavedModel's) tables."""
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  out = {}
  for key, dtype in dtypes.items():
    name = key[len(prefix) : -len(VALUE)]
    if key.startswith(prefix) and key.endswith(VALUE) and "/" not in name:
      if ".S" not in name:  # not a slot
        out[name] = (dtype, reader.get_tensor(key))
  return out


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
  """The tiny bfloat16 run, trained once for the module: tests export,
  evaluate or resume a copy (`_copy_of`)."""
  model_dir = str(tmp_path_factory.mktemp("bf16") / "run")
  assert _train(model_dir, BF16) == 0
  return model_dir


def _copy_of(run, tmp_path):
  """A copy of a trained run's folder (file times kept) in tmp_path/run."""
  model_dir = str(tmp_path / "run")
  shutil.copytree(run, model_dir)
  return model_dir


# ~25 s: trains a tiny run, exports, serves and evaluates it in-process
@pytest.mark.slow
def test_a_bfloat16_run_exports_serves_and_evaluates(tmp_path, bf16_run):
  model_dir = _copy_of(bf16_run, tmp_path)
  export_dir = str(tmp_path / "export")
  ckpt = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  trained = _tables(ckpt, "embedding/")
  assert trained and all(d == tf.bfloat16 for d, _ in trained.values())

  try:
    assert (
      cli.main(["export", "--model_dir", model_dir, "--export_dir", export_dir])
      == 0
    )
  finally:
    gin.clear_config()
  # The export's tables are float32 and exactly the trained bfloat16 rows.
  served = _tables(
    os.path.join(export_dir, "variables", "variables"), "embedding/"
  )
  assert sorted(served) == sorted(trained)
  for name, (dtype, value) in served.items():
    assert dtype == tf.float32, name
    np.testing.assert_array_equal(value, trained[name][1].astype(np.float32))

  # The served scores are the model's on the bfloat16 tables, looked up by
  # the training backend (tensorcore, upcasting its narrow rows).
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  config.parse(
    [os.path.join(model_dir, "operative_config.gin")],
    ["train.progress_bar = False", "train.summaries = False"],
  )
  try:
    trainer = train(model_dir=model_dir, action="build")
  finally:
    gin.clear_config()
  held = trainer.backend.layouts().values()
  assert {str(layout.dtype) for layout in held} == {"bfloat16"}
  features, _ = next(iter(trainer.run.source.dataset(13, training=False)))
  names = list(trainer.run.feature_config)
  acts = trainer.backend.lookup({n: features["categorical"][n] for n in names})
  want = trainer.model(acts, features).numpy()
  specs = {s.name: s for s in trainer.run.source.feature_specs}
  inputs = {"dense": features["dense"]}
  for n in names:
    ids = features["categorical"][n]
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=-1, shape=[None, specs[n].max_ids])
    inputs[n] = ids
  loaded = tf.saved_model.load(export_dir)
  got = loaded.signatures["serving_default"](**inputs)["scores"].numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  # `recsys evaluate` restores the run as trained (bfloat16 tables): the
  # same AUC as the run's own final evaluation.
  try:
    assert cli.main(["evaluate", "--model_dir", model_dir]) == 0
  finally:
    gin.clear_config()
  with open(os.path.join(model_dir, "metrics.json")) as f:
    final = json.load(f)
  with open(os.path.join(model_dir, "eval_metrics.json")) as f:
    evaluated = json.load(f)
  np.testing.assert_allclose(
    evaluated["eval/auc"], final["eval/auc"], rtol=1e-6
  )


# ~25 s: trains a tiny run, then resumes it twice with another table dtype
@pytest.mark.slow
def test_a_resume_may_change_the_table_dtype(tmp_path, caplog, bf16_run):
  """bfloat16 -> float32 restores exactly, float32 -> bfloat16 rounds to
  nearest; each resume then trains and saves its own dtype."""
  model_dir = _copy_of(bf16_run, tmp_path)
  ckpts = os.path.join(model_dir, "checkpoints")
  with caplog.at_level("INFO", "recsys.backends"):
    assert _train(model_dir, "train.train_steps = 6") == 0
  assert "holds it in bfloat16; restoring into float32 (exact)" in caplog.text
  wide = _tables(tf.train.latest_checkpoint(ckpts), "embedding/")
  assert all(d == tf.float32 for d, _ in wide.values())
  caplog.clear()
  with caplog.at_level("INFO", "recsys.backends"):
    assert _train(model_dir, BF16, "train.train_steps = 8") == 0
  assert "restoring into bfloat16 (rounded to nearest" in caplog.text
  narrow = _tables(tf.train.latest_checkpoint(ckpts), "embedding/")
  assert all(d == tf.bfloat16 for d, _ in narrow.values())


def _poke(checkpoint: str, key: str, value: float) -> None:
  """Rewrites `checkpoint` with `key`'s first value set to `value` (as a
  long float32 run might hold): every tensor read and saved again."""
  reader = tf.train.load_checkpoint(checkpoint)
  names = sorted(reader.get_variable_to_dtype_map())
  tensors = [reader.get_tensor(n) for n in names]
  poked = tensors[names.index(key)].copy()
  poked.flat[0] = value
  tensors[names.index(key)] = poked
  tf.raw_ops.SaveV2(
    prefix=checkpoint,
    tensor_names=names,
    shape_and_slices=[""] * len(names),
    tensors=tensors,
  )


# ~10 s: trains a tiny float32 run, then resumes it in float16 twice
@pytest.mark.slow
def test_a_float16_resume_refuses_values_beyond_its_range(tmp_path, capsys):
  """A float32 checkpoint holding 1e6 resumed with float16 tables: refused
  naming the table, the count and the largest (TF's cast made it inf,
  then a NaN loss blamed a batch), nothing saved; asked to saturate, the
  run trains on from 65504."""
  model_dir = str(tmp_path / "run")
  ckpts = os.path.join(model_dir, "checkpoints")
  assert _train(model_dir) == 0
  latest = tf.train.latest_checkpoint(ckpts)
  name = sorted(_tables(latest, "embedding/"))[0]
  _poke(latest, f"embedding/{name}{VALUE}", 1e6)
  capsys.readouterr()
  fp16 = 'EmbeddingPlacement.table_dtype = "float16"'
  assert _train(model_dir, fp16, "train.train_steps = 6") == 1
  err = capsys.readouterr().err
  assert f"table {name!r}: checkpoint {latest} holds 1 value(s)" in err
  assert "the largest 1e+06" in err and "saturate_restores" in err
  assert tf.train.latest_checkpoint(ckpts) == latest  # nothing saved
  allowed = "train.backend_options = {'saturate_restores': True}"
  assert _train(model_dir, fp16, allowed, "train.train_steps = 6") == 0
  resumed = _tables(tf.train.latest_checkpoint(ckpts), "embedding/")
  dtype, rows = resumed[name]
  assert dtype == tf.float16
  assert np.isfinite(rows).all() and abs(float(rows.flat[0])) > 6e4
