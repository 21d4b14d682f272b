"""Symlinks and hard links in a model dir are never written through.

A `metrics.json` or `.recsys.lock` pointing at another file used to be
truncated and overwritten by a run (`recsys.model_dir.run_files`).
"""

import json
import os

import pytest

from recsys.model_dir import lock as lock_lib
from recsys.model_dir import run_files
from tests.reliability.test_bad_model_dir import make_trainer


@pytest.fixture
def victim(tmp_path):
  path = tmp_path / "precious.txt"
  path.write_text("do not touch")
  return path


@pytest.mark.parametrize("name", [".recsys.lock", "metrics.json"])
def test_a_run_refuses_a_linked_run_file_before_training(
  tmp_path, victim, name
):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  os.symlink(victim, model_dir / name)
  with pytest.raises(
    run_files.UnsafeRunFileError, match=f"{name} is a symbolic link"
  ):
    make_trainer(model_dir).train()
  assert victim.read_text() == "do not touch"
  assert not (model_dir / "checkpoints").exists()  # refused before any step


def test_a_hard_linked_lock_file_is_refused(tmp_path, victim):
  os.link(victim, tmp_path / lock_lib.LOCK_FILE)
  with pytest.raises(run_files.UnsafeRunFileError, match="hard link"):
    lock_lib.ModelDirLock(str(tmp_path)).acquire()
  assert victim.read_text() == "do not touch"


def test_write_text_replaces_a_hard_link_and_never_writes_through_one(
  tmp_path, victim
):
  path = tmp_path / "metrics.json"
  os.link(victim, path)
  run_files.write_text(str(path), json.dumps({"auc": 0.5}))
  assert json.loads(path.read_text()) == {"auc": 0.5}
  assert victim.read_text() == "do not touch"
  assert sorted(os.listdir(tmp_path)) == ["metrics.json", "precious.txt"]
  os.symlink(victim, tmp_path / "eval_metrics.json")
  with pytest.raises(run_files.UnsafeRunFileError):
    run_files.write_text(str(tmp_path / "eval_metrics.json"), "{}")
  assert victim.read_text() == "do not touch"


def test_a_run_still_writes_its_files(tmp_path):
  model_dir = tmp_path / "model"
  metrics = make_trainer(model_dir).train()
  written = json.loads((model_dir / "metrics.json").read_text())
  assert written["step"] == metrics["step"] == 2
  assert not [n for n in os.listdir(model_dir) if n.startswith(".metrics")]


def test_a_save_that_runs_out_of_space_leaves_no_temporary_folder(tmp_path):
  """RLIMIT_FSIZE makes writes fail as a full disk does (EFBIG for ENOSPC)."""
  resource = pytest.importorskip("resource")
  import signal  # pylint: disable=g-import-not-at-top

  model_dir = tmp_path / "model"
  trainer = make_trainer(model_dir)
  trainer.train()
  checkpoints = model_dir / "checkpoints"
  before = sorted(os.listdir(checkpoints))
  trainer.run.global_step.assign_add(1)
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (256, hard))
  try:
    with pytest.raises(Exception) as e:  # noqa: B017 - TF's or Python's
      trainer.save()
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)
  assert "too large" in str(e.value).lower() or "space" in str(e.value).lower()
  assert sorted(os.listdir(checkpoints)) == before  # no ckpt-3_temp
  assert trainer.save().endswith("ckpt-3")  # space again: it saves
