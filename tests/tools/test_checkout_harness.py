"""`recsys benchmark movielens` runs benchmarks/movielens_benchmark.py from
the checkout beside the package, and says where it looked when there is
none (an installed wheel)."""

import os

import pytest

from recsys.tools import checkout_harness


def test_the_door_finds_the_harness_in_this_checkout():
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  assert checkout_harness.HARNESS == os.path.join(
    root, "benchmarks", "movielens_benchmark.py"
  )
  assert os.path.isfile(checkout_harness.HARNESS)


def test_without_a_checkout_the_error_names_the_path(tmp_path, monkeypatch):
  missing = str(tmp_path / "benchmarks" / "movielens_benchmark.py")
  monkeypatch.setattr(checkout_harness, "HARNESS", missing)
  with pytest.raises(checkout_harness.HarnessNotFoundError) as e:
    checkout_harness.main(["--help"], prog="recsys benchmark movielens")
  assert "source checkout" in str(e.value) and missing in str(e.value)
