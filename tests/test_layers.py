"""Imports run downwards: what sits below training never imports it.

The run folder (`recsys/run_folder/`), the serving modules
(`recsys/serving_*.py`), the models' `model_args` and the SavedModel export
(`recsys/export.py`) are used by training, `recsys evaluate` and `recsys
export`; an import of `recsys.training` from them would run upwards (and
made `recsys export` load the training loop for one lookup). The check reads
the sources' imports (ast), so it holds for imports inside functions too.
"""

import ast
import glob
import os

import pytest

import recsys

ROOT = os.path.dirname(recsys.__file__)

BELOW_TRAINING = sorted(
  glob.glob(os.path.join(ROOT, "run_folder", "*.py"))
  + glob.glob(os.path.join(ROOT, "serving_*.py"))
  + [
    os.path.join(ROOT, "models", "model_args.py"),
    os.path.join(ROOT, "export.py"),
  ]
)


def imported_modules(path: str) -> set[str]:
  """Every module `path` imports: `a.b` for `import a.b`, `from a import b`."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_the_scan_sees_what_it_looks_for():
  assert len(BELOW_TRAINING) >= 12
  assert "recsys.run_folder.run_files" in imported_modules(
    os.path.join(ROOT, "run_folder", "lock.py")
  )
  assert "recsys.run_folder" in imported_modules(
    os.path.join(ROOT, "training", "trainer.py")
  )


@pytest.mark.parametrize(
  "path", BELOW_TRAINING, ids=lambda p: os.path.relpath(p, ROOT)
)
def test_imports_nothing_from_training(path):
  upward = sorted(
    name
    for name in imported_modules(path)
    if name == "recsys.training" or name.startswith("recsys.training.")
  )
  assert not upward, f"{os.path.relpath(path, ROOT)} imports {upward}"
