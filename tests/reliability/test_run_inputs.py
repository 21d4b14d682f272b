"""Fingerprints of a run's input files: what counts as changed data."""

import hashlib
import os

from recsys.model_dir import run_configs, run_inputs


def test_content_decides_not_the_modification_time(tmp_path):
  path = tmp_path / "u.data"
  path.write_text("1\t1\t5\t1\n")
  before = run_inputs.fingerprints([str(path)])
  want = hashlib.sha256(b"1\t1\t5\t1\n").hexdigest()
  assert before[str(path)]["sha256"] == want
  os.utime(path, (1, 1))  # touched, or copied without -p: the same data
  assert run_inputs.changed_files(before, run_inputs.fingerprints([path])) == []
  path.write_text("1\t1\t4\t1\n")  # same size, another rating
  assert run_inputs.changed_files(before, run_inputs.fingerprints([path])) == [
    f"{path}: same size (8 bytes), other content than when the run read it"
  ]
  path.write_text("1\t1\t4\t12\n")
  assert run_inputs.changed_files(before, run_inputs.fingerprints([path])) == [
    f"{path}: 8 bytes when the run read it, 9 bytes now"
  ]


def test_files_added_removed_or_moved(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  for folder in ("a", "b"):
    (tmp_path / folder / "day_0").write_text("x\n")
  (tmp_path / "a" / "day_1").write_text("y\n")
  old = run_inputs.fingerprints(
    [str(tmp_path / "a" / "day_0"), str(tmp_path / "a" / "day_1")]
  )
  # day_0 moved to b/ (same name and content): the same file; day_1 gone.
  new = run_inputs.fingerprints([str(tmp_path / "b" / "day_0")])
  assert run_inputs.changed_files(old, new) == [
    f"{tmp_path / 'a' / 'day_1'}: read by the run, not read now"
  ]
  (tmp_path / "b" / "day_2").write_text("z\n")
  new = run_inputs.fingerprints(
    [str(tmp_path / "a" / "day_0"), str(tmp_path / "a" / "day_1")]
    + [str(tmp_path / "b" / "day_2")]
  )
  assert run_inputs.changed_files(old, new) == [
    f"{tmp_path / 'b' / 'day_2'}: read now, not read by the run"
  ]


def test_large_files_hash_their_edges(tmp_path, monkeypatch):
  monkeypatch.setattr(run_inputs, "FULL_HASH_BYTES", 64)
  monkeypatch.setattr(run_inputs, "EDGE_BYTES", 16)
  path = tmp_path / "day_0"
  data = bytes(range(200))
  path.write_bytes(data)
  before = run_inputs.fingerprints([str(path)])
  head = hashlib.sha256(data[:16]).hexdigest()
  tail = hashlib.sha256(data[-16:]).hexdigest()
  assert before[str(path)]["sha256_edges"] == f"{head}:{tail}"
  path.write_bytes(data[:100] + b"\0" + data[101:])  # the middle: not read
  after = run_inputs.fingerprints([str(path)])
  os.utime(path, (1, 1))
  after = run_inputs.fingerprints([str(path)])
  assert run_inputs.changed_files(before, after) == []
  assert run_inputs.unverified_files(before, after) == [str(path)]
  path.write_bytes(data[:-1] + b"\0")  # the last byte: read
  assert run_inputs.changed_files(before, run_inputs.fingerprints([path]))


def test_data_settings_follow_references_and_macros():
  text = (
    "DIR = '/data'\n"
    "train.data = @MovieLens()\n"
    "train.model = @FM\n"
    "MovieLens.data_dir = %DIR\n"
    "MovieLens.history = @UserHistory()\n"
    "UserHistory.weights = 'rating'\n"
    "FM.dim = 3\n"
  )
  assert run_configs.data_settings(text) == {
    "train.data",
    "train.eval_data",
    "MovieLens.data_dir",
    "MovieLens.history",
    "UserHistory.weights",
    "DIR.",
  }
