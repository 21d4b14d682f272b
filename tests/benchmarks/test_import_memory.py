"""`benchmarks/import_memory.py` runs as the README shows it, in a fresh
process (no conftest set-up), on a short run."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow
def test_import_memory_reports_each_phase_from_a_fresh_process():
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  result = subprocess.run(
    [
      sys.executable,
      os.path.join("benchmarks", "import_memory.py"),
      "--steps",
      "20",
      "--modes",
      "release",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  rows = {
    m.group(1): [int(x) for x in m.groups()[1:]]
    for m in re.finditer(
      r"^\| ([^|]+?) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$",
      result.stdout,
      re.MULTILINE,
    )
  }
  assert list(rows) == [
    "python started",
    "import tensorflow",
    "import recsys training stack",
    "TF library pages released",
    "trained 20 steps",
  ], result.stdout
  for rss, anon, file, peak in rows.values():
    assert rss == pytest.approx(anon + file, abs=2) and peak >= rss - 2
  # Importing TF maps its libraries; releasing can only lower the file part
  # (other TF processes sharing the pages keep them resident).
  assert rows["import tensorflow"][2] > rows["python started"][2]
  released = rows["TF library pages released"][2]
  assert released <= rows["import recsys training stack"][2]
  assert "highest RSS sampled while training" in result.stdout
