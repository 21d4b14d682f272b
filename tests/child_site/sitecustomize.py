"""Grappler off in the Python processes the tests start, as in the test
processes themselves (tests/conftest.py; docs/testing.md, "Suite time").

tests/conftest.py puts this folder first on PYTHONPATH (unless
RECSYS_TEST_TF_DEFAULTS=1), so every Python the tests start imports this
module at start-up. It runs nothing then: it waits for TensorFlow's import
and turns TF's graph optimizer off right after it, before any graph runs.
A test's child runs a few steps of small graphs: grappler's rewrite before
each function's first call cost ~8 % of their CPU. Tests that run what a
user runs with TF's defaults take this folder off their PYTHONPATH
(`without_child_site`).
"""

import importlib.abc
import importlib.util
import sys


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as the other finders do; runs its module, then
  turns grappler off."""

  def find_spec(self, name, path, target=None):  # noqa: ARG002
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)  # once; the finders below find the spec
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    run_module = spec.loader.exec_module

    def exec_module(module):
      run_module(module)
      module.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": True}
      )

    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _AfterTensorFlow())
