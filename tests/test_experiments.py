"""Every gin file in experiments/ parses; the default experiment trains."""

import glob
import json
import os
import re

import gin
import pytest

from recsys import config
from recsys.training import train

EXPERIMENTS = config.EXPERIMENTS_DIR
DEFAULT = os.path.join(EXPERIMENTS, "synthetic_dlrm.gin")
ALL_FILES = sorted(
  glob.glob(os.path.join(EXPERIMENTS, "**", "*.gin"), recursive=True)
)
# Files in these folders override an experiment: parse them after one.
OVERRIDE_DIRS = ("hardware", "data")

TINY = [
  "train.global_batch_size = 64",
  "train.train_steps = 4",
  "train.steps_per_loop = 2",
  "train.eval_steps = 2",
  "train.progress_bar = False",
  "SyntheticCTR.oracle_examples = 4096",
]


def required_macros(files):
  """Macros declared `NAME = %gin.REQUIRED` in the files and their includes."""
  names = set()
  for path in config._gin_files_closure(files):  # pylint: disable=protected-access
    with open(path, encoding="utf-8") as f:
      names.update(re.findall(r"^(\w+)\s*=\s*%gin\.REQUIRED", f.read(), re.M))
  return sorted(names)


def test_there_are_experiments():
  names = {os.path.relpath(p, EXPERIMENTS) for p in ALL_FILES}
  assert {
    "base.gin",
    "synthetic_dlrm.gin",
    "synthetic_dcn.gin",
    "synthetic_two_tower.gin",
    "criteo_dlrm.gin",
    "criteo_dcn.gin",
    "movielens_ranking.gin",
    "movielens_retrieval.gin",
    "hardware/tpu.gin",
    "hardware/cpu_2replicas.gin",
  } <= names


@pytest.mark.parametrize(
  "path", ALL_FILES, ids=[os.path.relpath(p, EXPERIMENTS) for p in ALL_FILES]
)
def test_gin_file_parses_with_required_macros_bound(path):
  with open(path, encoding="utf-8") as f:
    first = f.readline()
  assert first.startswith("#"), (
    f"{path} must open with a comment saying what it configures"
  )
  rel = os.path.relpath(path, EXPERIMENTS)
  files = [DEFAULT, path] if rel.startswith(OVERRIDE_DIRS) else [path]
  macros = required_macros(files)
  bindings = [f"{name} = '/nonexistent/{name.lower()}'" for name in macros]
  config.parse(files, bindings)
  if rel != "base.gin":  # base.gin holds trainer defaults only
    # The experiment names a data source and a model.
    assert gin.query_parameter("train.data") is not None
    assert gin.query_parameter("train.model") is not None
  if macros:
    gin.clear_config()
    with pytest.raises(config.GinConfigError, match=macros[0]):
      config.parse(files)


def test_default_experiment_trains_a_few_steps(tmp_path):
  config.parse([DEFAULT], TINY)
  metrics = train(model_dir=str(tmp_path))
  assert metrics["step"] == 4
  saved = json.loads((tmp_path / "metrics.json").read_text())
  assert 0.0 <= saved["eval/auc"] <= 1.0 and saved["bayes_auc"] > 0.5
  assert (
    "train.global_batch_size = 64"
    in (tmp_path / "operative_config.gin").read_text()
  )
