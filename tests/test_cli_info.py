"""`recsys info` reports what `recsys train` with the same flags would run.

The strategy comes from the gin files (a hardware override included), and
the memory plan from the data source, or, before its files are downloaded,
from the vocabulary sizes its gin settings give.
"""

import os

import gin

from recsys import cli, config

EXPERIMENTS = config.EXPERIMENTS_DIR


def _info(capsys, *gin_files, bindings=()):
  argv = ["info"]
  for path in gin_files:
    argv += ["--gin_file", os.path.join(EXPERIMENTS, path)]
  for binding in bindings:
    argv += ["--gin_bindings", binding]
  assert cli.main(argv) == 0
  gin.clear_config()
  return capsys.readouterr().out


def test_info_builds_the_strategy_the_gin_files_ask_for(capsys):
  out = _info(capsys, "synthetic_dlrm.gin", "hardware/cpu_2replicas.gin")
  assert "strategy: MirroredStrategy (2 replica(s))" in out
  # Two replicas on one host share its RAM: the plan says so.
  assert "host RAM / 2 replicas on this host" in out
  # Issue 52: the report ends with one line, as every command does.
  assert out.splitlines()[-1] == (
    "recsys info: recsys train would use the tensorcore backend on 2 "
    "replica(s); its tables take 4.0 MiB per device, they fit."
  )


def test_info_builds_the_data_source_once(capsys, monkeypatch):
  """Issue 52: `recsys info` ("no data needed") built the synthetic source,
  which draws its planted model, twice."""
  from recsys.data import synthetic_ctr  # pylint: disable=g-import-not-at-top

  built = []
  init = synthetic_ctr.SyntheticCTR.__init__

  def counted(self, *args, **kwargs):
    built.append(1)
    init(self, *args, **kwargs)

  monkeypatch.setattr(synthetic_ctr.SyntheticCTR, "__init__", counted)
  _info(capsys, "synthetic_dlrm.gin")
  assert len(built) == 1


def test_info_plans_criteo_from_its_gin_sizes_before_the_download(capsys):
  """No CRITEO_DIR bound, no files: the tables still get their plan."""
  out = _info(capsys, "criteo_dlrm.gin", "hardware/cpu_small.gin")
  # Kaggle's C3 has 10,131,227 ids; cpu_small.gin caps every table at 50,000
  # rows of 128 float32 (SGD: no slot) = 24.4 MiB.
  assert "C3     50000  128  float32  SGD        0      24.4 MiB" in out
  assert (
    "C9     3      128  float32  SGD" in out
  )  # a small table keeps its size
  assert (
    "planned from CriteoTSV's vocabulary sizes in the gin config, without "
    "its data files (CRITEO_DIR is not bound)"
  ) in out


def test_info_plans_criteo_when_the_folder_does_not_exist(capsys, tmp_path):
  missing = str(tmp_path / "criteo")
  out = _info(capsys, "criteo_dcn.gin", bindings=[f"CRITEO_DIR = {missing!r}"])
  assert "C3     10000000" in out  # criteo_kaggle.gin's cap of 10M rows
  assert "without its data files (Criteo kaggle data: folder" in out
  assert "In call to configurable" not in out


def test_info_says_why_movielens_has_no_plan_without_its_files(capsys):
  out = _info(capsys, "movielens_ranking.gin")
  assert "embedding backend: auto -> tensorcore" in out
  assert (
    "no memory plan: MovieLens takes its vocabulary sizes from its files, "
    "which cannot be read here (MOVIELENS_DIR is not bound)"
  ) in out
