"""Reading a TF door's source (`backends/_tf_internal.py`,
`recsys/_tf_internal.py`) and the packages around it, for the tests that
fail when a TF upgrade removes what a door takes or when a private TF import
appears outside its package's door."""

import ast
import importlib
import pathlib

import pytest

PRIVATE_TF = ("tensorflow.python", "tensorflow.core")


def _tree(path: pathlib.Path) -> ast.AST:
  return ast.parse(path.read_text(), filename=str(path))


def _tf_modules(tree: ast.AST) -> dict[str, str]:
  """`{local name: module path}` of the TF modules a file imports."""
  out = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
      "tensorflow."
    ):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        try:
          importlib.import_module(full)
        except ImportError:
          continue  # a symbol, not a module
        out[alias.asname or alias.name] = full
  return out


def tf_symbols(path: pathlib.Path) -> list[str]:
  """Every `module.symbol` a door takes from TF, as dotted paths: what it
  imports from a TF module, and what it reads off a TF module it imported."""
  tree = _tree(path)
  modules = _tf_modules(tree)
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
      "tensorflow."
    ):
      found.update(f"{node.module}.{a.name}" for a in node.names)
    elif (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in modules
    ):
      found.add(f"{modules[node.value.id]}.{node.attr}")
  return sorted(found)


def check_symbol_exists(symbol: str, where: str) -> None:
  """Fails the test, naming the door (`where`), when TF no longer has
  `symbol` (`module.name`): a TF upgrade removed or renamed it."""
  module_path, name = symbol.rsplit(".", 1)
  try:
    module = importlib.import_module(module_path)
  except ImportError as e:
    pytest.fail(f"{where}: TF has no module {module_path!r} any more ({e})")
  assert hasattr(module, name), (
    f"{where}: {module_path} has no {name!r} any more: a TF upgrade removed "
    "or renamed it; find its replacement and change the door (only it)."
  )


def private_attributes(path: pathlib.Path) -> set[str]:
  """The `_private` attributes a door reads off objects (`x._a`,
  `getattr(x, "_a", ...)`), dunders aside."""
  names = set()
  for node in ast.walk(_tree(path)):
    if (
      isinstance(node, ast.Attribute)
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
    ):
      names.add(node.attr)
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id == "getattr"
      and len(node.args) >= 2
      and isinstance(node.args[1], ast.Constant)
      and str(node.args[1].value).startswith("_")
      and not str(node.args[1].value).startswith("__")
    ):
      names.add(node.args[1].value)
  return names


def private_tf_imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """`[(line, module)]` of a file's imports of `tensorflow.python` /
  `tensorflow.core`, anywhere in it (function-local imports and
  `importlib.import_module("...")` / `__import__("...")` calls too)."""
  out = []
  for node in ast.walk(_tree(path)):
    names: list[str] = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names = [node.module or ""]
      if node.module == "tensorflow":  # from tensorflow import python
        names = [f"tensorflow.{a.name}" for a in node.names]
    elif isinstance(node, ast.Call) and node.args:
      func = node.func
      called = getattr(func, "attr", None) or getattr(func, "id", None)
      first = node.args[0]
      if called in ("import_module", "__import__") and isinstance(
        first, ast.Constant
      ):
        names = [str(first.value)]
    out += [
      (node.lineno, name)
      for name in names
      if any(name == p or name.startswith(p + ".") for p in PRIVATE_TF)
    ]
  return out
