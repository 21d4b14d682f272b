"""A resume with changed math settings is refused, naming them; every run's
operative config is kept, numbered."""

import os

import gin
import numpy as np
import pytest

from recsys import config
from recsys.model_dir import run_configs
from recsys.training import train

TINY = [
  "SyntheticCTR.vocab_sizes = (23, 29)",
  "SyntheticCTR.multi_hot_sizes = (1, 3)",
  "SyntheticCTR.num_dense = 3",
  "SyntheticCTR.oracle_examples = 512",
  "SyntheticCTR.num_eval_examples = 40",
  "EmbeddingSettings.dim = 7",
  "DLRM.bottom_mlp = (7,)",
  "DLRM.top_mlp = (7,)",
  "train.global_batch_size = 16",
  "train.steps_per_loop = 2",
  "train.eval_steps = None",
  "train.summaries = False",
  "train.progress_bar = False",
]


def run(model_dir, *bindings):
  """One `recsys train` on `model_dir` (fresh gin state, as a new process)."""
  gin.clear_config()
  config.parse(
    [os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")],
    TINY + list(bindings),
  )
  return train(model_dir=str(model_dir))


def read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


@pytest.mark.slow
def test_changed_math_settings_are_refused_unless_allowed(tmp_path):
  run(tmp_path, "train.train_steps = 2")
  # More steps and another eval cadence change no math: resumed.
  assert (
    run(tmp_path, "train.train_steps = 4", "train.eval_steps = 1")["step"] == 4
  )
  kept = run_configs.numbered_configs(str(tmp_path))
  assert [os.path.basename(p) for p in kept] == [
    "operative_config-1.gin",
    "operative_config-2.gin",
  ]
  before = read(tmp_path / "operative_config.gin")

  with pytest.raises(run_configs.ChangedSettingsError) as e:
    run(
      tmp_path,
      "train.train_steps = 6",
      "EmbeddingSettings.combiner = 'sum'",
      "train.global_batch_size = 8",
    )
  message = str(e.value)
  assert "step 4" in message and "--allow_changed_settings" in message
  assert "EmbeddingSettings.combiner: 'mean' -> 'sum'" in message
  assert "train.global_batch_size: 16 -> 8" in message
  assert "train_steps" not in message
  assert (
    read(tmp_path / "operative_config.gin") == before
  )  # nothing overwritten
  assert len(run_configs.numbered_configs(str(tmp_path))) == 2

  assert (
    run(
      tmp_path,
      "train.train_steps = 6",
      "EmbeddingSettings.combiner = 'sum'",
      "train.allow_changed_settings = True",
    )["step"]
    == 6
  )
  kept = run_configs.numbered_configs(str(tmp_path))
  assert len(kept) == 3
  assert "EmbeddingSettings.combiner = 'mean'" in read(kept[1])
  assert "EmbeddingSettings.combiner = 'sum'" in read(kept[2])
  assert "EmbeddingSettings.combiner = 'sum'" in read(
    tmp_path / "operative_config.gin"
  )


def test_changed_settings_compare_values_not_text():
  old = "A.x = (1, 2)\nA.y = @B()\nA.z = 3\ntrain.train_steps = 10\nC.w = 1\n"
  new = "A.x = (1,2)\nA.y = @D()\nA.z = 3\ntrain.train_steps = 20\nE.v = 2\n"
  assert run_configs.changed_settings(old, new) == [("A.y", "@B()", "@D()")]


def test_operative_config_is_a_text_summary_and_hparams(tmp_path):
  """TensorBoard shows the run's settings: the config as a text summary, its
  plain values in the HParams plugin (tensorboard is a dependency)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from recsys.run import run_summaries  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  config.parse(
    [os.path.join(config.EXPERIMENTS_DIR, "synthetic_dlrm.gin")],
    TINY + ["train.train_steps = 2", "train.summaries = True"],
  )
  train(model_dir=str(tmp_path))
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top

  texts, hparams = [], {}
  for path in tf.io.gfile.glob(str(tmp_path / "train" / "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == run_summaries.CONFIG_TAG:
          assert value.metadata.plugin_data.plugin_name == "text"
          texts.append(tf.make_ndarray(value.tensor).item().decode())
        if value.metadata.plugin_data.plugin_name == "hparams":
          data = plugin_data_pb2.HParamsPluginData.FromString(
            value.metadata.plugin_data.content
          )
          hparams.update(data.session_start_info.hparams)
  # TensorBoard's HParams tab: the plain values of the config, one session.
  assert hparams["train.global_batch_size"].number_value == 16
  assert hparams["EmbeddingSettings.dim"].number_value == 7
  assert hparams["EmbeddingSettings.combiner"].string_value == "mean"
  assert "train.data" not in hparams
  assert len(texts) == 1
  assert "    EmbeddingSettings.combiner = 'mean'" in texts[0]
  assert read(tmp_path / "operative_config.gin").splitlines()[0] in texts[0]
  params = run_summaries.hparams(read(tmp_path / "operative_config.gin"))
  assert (
    params["train.global_batch_size"] == 16
    and params["EmbeddingSettings.dim"] == 7
  )
  assert "train.data" not in params  # a reference, not a value


#: Both learning rates decay linearly from step 2 over the run's length, as
#: the MovieLens files write it (`decay_steps = @total_train_steps()`).
SCHEDULE = [
  "embedding.Adam.learning_rate = @table_lr/WarmupPolyDecay()",
  "table_lr/WarmupPolyDecay.base_learning_rate = 0.01",
  "table_lr/WarmupPolyDecay.decay_start_step = 2",
  "table_lr/WarmupPolyDecay.decay_steps = @total_train_steps()",
  "table_lr/WarmupPolyDecay.power = 1.0",
  "keras.optimizers.Adam.learning_rate = @dense_lr/WarmupPolyDecay()",
  "dense_lr/WarmupPolyDecay.base_learning_rate = 0.003",
  "dense_lr/WarmupPolyDecay.decay_start_step = 2",
  "dense_lr/WarmupPolyDecay.decay_steps = @total_train_steps()",
  "dense_lr/WarmupPolyDecay.power = 1.0",
  "train.steps_per_loop = 1",
  "train.summaries = True",
]


def logged_learning_rates(model_dir):
  """{step: the dense learning rate of that step} from the train summaries."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rates = {}
  for path in tf.io.gfile.glob(str(model_dir / "train" / "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "learning_rate":
          rates[event.step] = float(tf.make_ndarray(value.tensor))
  return rates


@pytest.mark.slow
def test_a_longer_resume_continues_the_learning_rate_it_reached(tmp_path):
  """docs/experiments.md: a schedule that follows train.train_steps
  stretches its remaining decay over the new length. The rate used to jump
  to where a run of the new length is at the resume step: from 0.0011 at
  step 8 up to 0.0021 at step 9 (a warm restart)."""
  run(tmp_path, *SCHEDULE, "train.train_steps = 8")
  assert run(tmp_path, *SCHEDULE, "train.train_steps = 20")["step"] == 20

  dense = logged_learning_rates(tmp_path)  # step s trains at lr(s - 1)
  assert sorted(dense) == list(range(1, 21))
  one_step = 0.003 / 8  # the first run's decay per step
  assert abs(dense[9] - dense[8]) <= one_step * 1.001, dense
  # The rest of the decay (from 2/8 of the peak at step 8 to 0 at step 22,
  # the first run's end 2 + 8 moved to 2 + 20), stretched, never rising.
  np.testing.assert_allclose(dense[9], 0.003 * 2 / 8, rtol=1e-5)
  np.testing.assert_allclose(dense[20], 0.003 * 2 / 8 * 3 / 14, rtol=1e-5)
  assert all(dense[s + 1] <= dense[s] for s in range(1, 20)), dense
  # The tables' rate follows the same decay (the same command once more:
  # nothing left to train, the schedules as the run left them).
  trainer = train(model_dir=str(tmp_path), action="build")
  trainer.train()
  table_lr = trainer.run.embedding_optimizer.learning_rate
  for step, want in ((7, 0.01 * 3 / 8), (8, 0.01 * 2 / 8), (19, 0.01 * 3 / 56)):
    trainer.run.global_step.assign(step)
    np.testing.assert_allclose(float(table_lr()), want, rtol=1e-5)
