"""A killed re-export leaves the previous export whole and loadable.

`recsys export` used to write into the export folder in place: a SIGKILL
midway left new variable data next to the old index (`DataLossError` on
load). Exports are now written to a hidden sibling and swapped in whole
(`recsys.model_dir.atomic_dir`). The test kills a real `recsys export` process the
moment anything under the export folder changes: the folder must then be
exactly the previous export, or exactly the complete new one.
"""

import os
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli
from recsys.model_dir import atomic_dir
from tests.cli_runs import DEFAULT, ROOT, export, flags, tiny


def _train(model_dir, steps):
  bindings = tiny(
    oracle_examples=1024,
    train_steps=steps,
    steps_per_loop=3,
    eval_steps=1,
    progress_bar=False,
  )
  args = ["train", "--gin_file", DEFAULT, "--model_dir", model_dir]
  assert cli.main(args + flags(bindings)) == 0
  gin.clear_config()


def _export(model_dir, export_dir):
  export(model_dir, export_dir)


def _tree(path):
  """Every file under `path` (relative name -> bytes), and the folder inode."""
  files = {}
  for root, _, names in os.walk(path):
    for name in names:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        files[os.path.relpath(full, path)] = f.read()
  return files, os.stat(path).st_ino


def _signature(path):
  """A cheap fingerprint of the tree: names, sizes, mtimes, the inode."""
  out = [os.stat(path).st_ino]
  for root, dirs, names in os.walk(path):
    for name in sorted(dirs + names):
      st = os.lstat(os.path.join(root, name))
      out.append((os.path.join(root, name), st.st_size, st.st_mtime_ns))
  return out


def _variables(path):
  reader = tf.train.load_checkpoint(
    os.path.join(path, "variables", "variables")
  )
  values = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}
  return {
    k: v
    for k, v in values.items()  # the object graph is bytes
    if isinstance(v, np.ndarray) and v.dtype != object
  }


@pytest.mark.slow  # ~25 s: two short trainings, two exports, a recsys process
def test_a_killed_re_export_leaves_a_whole_export(tmp_path):
  model_dir = str(tmp_path / "run")
  export_dir = str(tmp_path / "export")
  _train(model_dir, 3)
  _export(model_dir, export_dir)
  old_files, _ = _tree(export_dir)
  old_vars = _variables(export_dir)
  _train(model_dir, 6)  # the re-export has other tables to write

  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  before = _signature(export_dir)
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "recsys",
      "export",
      "--model_dir",
      model_dir,
      "--export_dir",
      export_dir,
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  killed = False
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if _signature(export_dir) != before:
      proc.send_signal(signal.SIGKILL)
      killed = True
      break
    time.sleep(0.001)
  err = proc.communicate(timeout=60)[1].decode()
  assert killed or proc.returncode == 0, err

  files, _ = _tree(export_dir)
  assert sorted(files) == sorted(old_files), "a mixture of files was left"
  got = _variables(export_dir)  # a mixed data file and index: DataLossError
  tf.saved_model.load(export_dir)
  if files != old_files:  # the new export, complete
    new_dir = str(tmp_path / "reference")
    _export(model_dir, new_dir)
    want = _variables(new_dir)
    assert any(not np.array_equal(want[k], old_vars[k]) for k in want)
  else:
    want = old_vars
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_an_export_never_replaces_a_folder_that_is_not_an_export(tmp_path):
  target = tmp_path / "not_an_export"
  target.mkdir()
  (target / "notes.txt").write_text("mine")
  with pytest.raises(atomic_dir.UnsafeReplaceError, match="not_an_export"):
    with atomic_dir.replaced_atomically(
      str(target),
      may_replace=lambda p: os.path.isfile(os.path.join(p, "saved_model.pb")),
    ):
      pass
  assert (target / "notes.txt").read_text() == "mine"


def test_a_failed_write_leaves_the_old_folder_and_no_temporary(tmp_path):
  target = tmp_path / "out"
  target.mkdir()
  (target / "a").write_text("old")
  with pytest.raises(RuntimeError):
    with atomic_dir.replaced_atomically(str(target)) as tmp:
      with open(os.path.join(tmp, "a"), "w", encoding="utf-8") as f:
        f.write("half")
      raise RuntimeError("disk full")
  assert sorted(os.listdir(tmp_path)) == ["out"]
  assert (target / "a").read_text() == "old"
  with atomic_dir.replaced_atomically(str(target)) as tmp:
    with open(os.path.join(tmp, "a"), "w", encoding="utf-8") as f:
      f.write("new")
  assert sorted(os.listdir(tmp_path)) == ["out"]
  assert (target / "a").read_text() == "new"
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(target).st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
