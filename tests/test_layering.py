"""Imports only run downwards (docs/architecture.md, "Layers").

Every import statement in `recsys/` and `backends/` — function-local ones
included, and `importlib.import_module("...")` of a literal name — is read
from the source (no import is executed), resolved to the module it names,
and checked against the layer table below: a module may import its own
layer and the layers under it. A new module must be placed in the table,
so the layering is decided, not discovered. The same imports may not form
a cycle (within a layer too), and nothing in the two packages imports
`benchmarks` or `tests`, which sit above them.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. A name stands for the module and everything under it.
LAYERS = (
  (
    "recsys",  # the lazy package root (itself only, not what is under it)
    "recsys.errors",
    "recsys._keras",
    "recsys._tf_internal",
    "recsys._tf_startup",
    "recsys.process",  # a command's threads, start-up, exits, console: no TF
    # gin's internals, recsys's gin names written down (no TF), a model
    # dir's config read back (bindings only); the checks are a layer up.
    "recsys.gin_config",
    "recsys.feature_spec",
    "recsys.ranges",  # each setting's valid range, declared: no TF
    "recsys.launch_guard",  # a launched task's parent-death guard: stdlib
  ),
  (
    "recsys.features",
    "recsys.config",
    "recsys.experiments_catalog",
    "recsys.gin_config.precheck",  # gin names checked before TF is imported
    "recsys.gin_config.range_check",  # gin-bound values in range, before TF
    "recsys.gin_config.unread",  # gin bindings nothing reads, before TF
  ),
  ("recsys.data",),
  # The memory plan and the tables' layouts: a run's and the Keras layer's.
  ("recsys.planning",),
  (
    "recsys.layers",
    "recsys.models",
    "recsys.serving",  # the serving lookup and the signatures' checks
  ),
  (
    "recsys.train_settings",  # declared once; the model dir reads its kinds
    "recsys.model_dir",  # the run's folder on disk: layout, lock, checkpoints
    "recsys.launch",
  ),
  # A run without its loop: restored, evaluated (what evaluate, export and
  # the Trainer share); never loads recsys.training.
  ("recsys.run",),
  # The SavedModel: below training, never loads the loop.
  ("recsys.serving.export",),
  ("recsys.training",),
  ("recsys.tools", "recsys.testing"),  # nothing in the library imports them
  ("recsys.cli", "recsys.cli_checks", "recsys.__main__"),
)

# The backends a run chooses by name: only the registry imports them, so
# training, planning and the CLI stay the same whichever backend runs.
# (`backends.mid_level.serving`, the lookup of an exported model, is shared by
# export and evaluation; `backends.tensorcore.kernels` is the build tool of the
# fused kernels.)
SPECIFIC_BACKENDS = (
  "backends.tensorcore.backend",
  "backends.mid_level.tpu_embedding",
  "backends.mid_level.tpu_embedding_v0",
  "backends.parameter_servers",
  "backends.mid_level.common",
  "backends.tensorcore.composed",
  "backends.storage.base",
  "backends.storage.exchange",
  "backends.storage.row_sharded",
  "backends.storage.replicated",
  "backends.storage.row_layout",
  "backends.tensorcore.engines",
  "backends.table_step",
  "backends._bags",
  "backends.static_bags",
)


def _modules(package):
  """{dotted module name: source path} of a package's Python files."""
  found = {}
  for folder, _, files in os.walk(os.path.join(ROOT, package)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        found[dotted.removesuffix(".__init__")] = path
  return found


def _imports(path):
  """Every absolute module name an import statement in `path` may load."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from recsys import features` loads recsys.features.
      for alias in node.names:
        yield node.lineno, f"{node.module}.{alias.name}"
    elif (
      isinstance(node, ast.Call)
      and _called_name(node.func) in _IMPORT_FUNCTIONS
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      yield node.lineno, node.args[0].value


#: Calls that import the module their first argument names.
_IMPORT_FUNCTIONS = ("import_module", "importlib.import_module", "__import__")


def _called_name(func):
  """`a.b.c` for a call of `a.b.c(...)`; None for anything else."""
  parts = []
  while isinstance(func, ast.Attribute):
    parts.append(func.attr)
    func = func.value
  if not isinstance(func, ast.Name):
    return None
  return ".".join([func.id, *reversed(parts)])


def _under(name, prefix):
  if prefix == "recsys":
    return name == prefix
  return name == prefix or name.startswith(prefix + ".")


def _layer(name):
  """The index in LAYERS of the most specific entry naming `name`."""
  best = None
  for index, entries in enumerate(LAYERS):
    for entry in entries:
      if _under(name, entry) and (best is None or len(entry) > len(best[1])):
        best = (index, entry)
  return None if best is None else best[0]


RECSYS = _modules("recsys")
BACKENDS = _modules("backends")


def _target(imported, known):
  """The known module an import names (`pkg.mod.attr` -> `pkg.mod`)."""
  while imported and imported not in known:
    imported = imported.rpartition(".")[0]
  return imported or None


def test_every_module_has_a_layer():
  unplaced = sorted(m for m in RECSYS if _layer(m) is None)
  assert not unplaced, f"place these modules in LAYERS: {unplaced}"


@pytest.mark.parametrize("module", sorted(RECSYS))
def test_recsys_imports_run_downwards(module):
  own = _layer(module)
  upward, backend = [], []
  for line, imported in _imports(RECSYS[module]):
    if imported.split(".")[0] == "backends":
      if any(_under(imported, b) for b in SPECIFIC_BACKENDS):
        backend.append(f"line {line}: {imported}")
      if _under(module, "recsys.models"):
        backend.append(f"line {line}: {imported} (models name no backend)")
      continue
    target = _target(imported, RECSYS)
    if target is None:
      continue
    if _layer(target) > own:
      upward.append(f"line {line}: {target} (layer {_layer(target)} > {own})")
  assert not upward, f"{module} imports upward: {upward}"
  assert not backend, f"{module} names a specific backend: {backend}"


@pytest.mark.parametrize("module", sorted(BACKENDS))
def test_backends_never_import_recsys(module):
  bad = [
    f"line {line}: {name}"
    for line, name in _imports(BACKENDS[module])
    if name.split(".")[0] == "recsys"
  ]
  assert not bad, f"{module} imports recsys: {bad}"


def test_the_check_sees_an_upward_import(tmp_path):
  """The scan itself: a data module importing the trainer is caught."""
  path = tmp_path / "bad.py"
  path.write_text("def f():\n  from recsys.training import trainer\n")
  ((line, name),) = list(_imports(str(path)))
  assert (line, _target(name, RECSYS)) == (2, "recsys.training.trainer")
  assert _layer("recsys.training.trainer") > _layer("recsys.data.movielens")


#: The folders beside the packages that use them, never imported by them.
ABOVE_THE_PACKAGES = ("benchmarks", "tests")


@pytest.mark.parametrize("module", sorted({**RECSYS, **BACKENDS}))
def test_no_package_module_imports_benchmarks_or_tests(module):
  """`benchmarks/` and `tests/` use the packages, never the other way round
  (`recsys benchmark movielens` runs the harness's file, it does not
  import it: recsys/tools/checkout_harness.py)."""
  path = {**RECSYS, **BACKENDS}[module]
  bad = [
    f"line {line}: {name}"
    for line, name in _imports(path)
    if name.split(".")[0] in ABOVE_THE_PACKAGES
  ]
  assert not bad, f"{module} imports what sits above the packages: {bad}"


def _import_graph(modules):
  """{module: {module it imports: the first line doing so}}, over `modules`
  ({dotted name: path}) only."""
  graph = {}
  for module, path in modules.items():
    edges = graph.setdefault(module, {})
    for line, imported in _imports(path):
      target = _target(imported, modules)
      if target is not None and target != module:
        edges.setdefault(target, line)
  return graph


def _cycles(graph):
  """The strongly connected components of more than one module (each a
  sorted list), found by Tarjan's algorithm without recursion."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      node, successors = work[-1]
      for successor in successors:
        if successor not in index:
          index[successor] = low[successor] = len(index)
          stack.append(successor)
          on_stack.add(successor)
          work.append((successor, iter(sorted(graph[successor]))))
          break
        if successor in on_stack:
          low[node] = min(low[node], index[successor])
      else:
        work.pop()
        if work:
          parent = work[-1][0]
          low[parent] = min(low[parent], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            found.append(sorted(component))
  return sorted(found)


def _shown(component, graph):
  """A cycle's imports, each `a:line -> b`, for the failure message."""
  members = set(component)
  return [
    f"{module}:{line} -> {target}"
    for module in component
    for target, line in sorted(graph[module].items())
    if target in members
  ]


def test_no_import_cycles():
  """No two modules of `recsys/` and `backends/` import each other, through
  any number of others, at module level or inside a function: each module
  can be read (and imported) after the ones it names."""
  graph = _import_graph({**RECSYS, **BACKENDS})
  cycles = [_shown(component, graph) for component in _cycles(graph)]
  assert not cycles, f"import cycles: {cycles}"


def test_the_check_sees_a_cycle_and_an_import_by_name(tmp_path):
  """The scans themselves: a three-module cycle is found (and a chain is
  not), and a literal `importlib.import_module` is read as an import."""
  graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
  assert _cycles(graph) == [["a", "b", "c"]]
  assert _shown(["a", "b", "c"], graph) == ["a:1 -> b", "b:2 -> c", "c:3 -> a"]
  assert _cycles({"a": {"b": 1}, "b": {}}) == []
  path = tmp_path / "door.py"
  path.write_text(
    "import importlib\n"
    "def f(name):\n"
    "  importlib.import_module('benchmarks.movielens_benchmark')\n"
    "  importlib.import_module(name)\n"
  )
  assert list(_imports(str(path))) == [
    (1, "importlib"),
    (3, "benchmarks.movielens_benchmark"),
  ]


@pytest.mark.parametrize(
  "module",
  [
    "recsys.model_dir.run_dir",
    "recsys.model_dir.checkpoints",
    "recsys.serving.lookup",
    "recsys.serving.export",
    "recsys.models.model_args",
    "recsys.run.restored",
    "recsys.run.evaluation",
    "recsys.run.configured",
    "recsys.data.sources",
  ],
)
def test_the_model_dir_serving_and_export_sit_below_training(module):
  """What `recsys evaluate` and `recsys export` use never loads training.

  The model dir and `model_args` lived in `recsys/training/`, export
  imported the training loop for its serving lookup, and evaluate and
  export built a whole Trainer; their places in the table keep them below
  it (so the scan above refuses any such import).
  """
  assert module in RECSYS
  assert _layer(module) < _layer("recsys.training")


# -- backend options: only backends/ reads their names
# --------------------------


def _option_probes(source, path="<source>"):
  """(line, what) for each place the source asks a backend which options
  it takes: a membership test on an `.options` attribute (`"placement" in
  backend_cls.options`), `hasattr` on a backend, or `inspect.signature` of
  a backend class's constructor (`cls.__init__`, `backend_cls.__init__`;
  an optimizer's is no backend's)."""
  found = []
  for node in ast.walk(ast.parse(source, path)):
    if isinstance(node, ast.Compare):
      tested = [
        right
        for op, right in zip(node.ops, node.comparators)
        if isinstance(op, (ast.In, ast.NotIn))
      ]
      if any(
        isinstance(t, ast.Attribute) and t.attr == "options" for t in tested
      ):
        found.append((node.lineno, "an `in ....options` test"))
    elif isinstance(node, ast.Call):
      func = ast.unparse(node.func)
      first = ast.unparse(node.args[0]) if node.args else ""
      backend_class = first.startswith("cls.") or "backend" in first
      if (
        func.endswith("signature")
        and first.endswith("__init__")
        and (backend_class)
      ):
        found.append((node.lineno, f"{func}({first})"))
      if func == "hasattr" and "backend" in first:
        found.append((node.lineno, f"hasattr({first}, ...)"))
  return found


def test_nothing_outside_backends_tests_a_backends_option_names():
  """A table's layout is planned (`recsys.planning`) and handed over as
  `layouts`; other arguments go to the backends that declare them through
  `backends.registry` (`check_options`, `declared_options`). Nothing in
  `recsys/` asks a backend class which option names it takes (issue 53:
  the planner, `make_backend` and the Keras layer each did), naming
  file:line."""
  bad = []
  for path in sorted(RECSYS.values()):
    with open(path, encoding="utf-8") as f:
      source = f.read()
    bad += [
      f"{os.path.relpath(path, ROOT)}:{line}: {what}"
      for line, what in _option_probes(source, path)
    ]
  assert not bad, (
    "a backend's option names tested outside backends/ (ask its "
    f"capabilities, plan_tables, layouts() or the registry): {bad}"
  )


def test_the_option_probe_check_sees_each_form():
  source = (
    "if 'placement' in backend_cls.options: pass\n"
    "if 'x' not in cls.options: pass\n"
    "accepted = inspect.signature(cls.__init__).parameters\n"
    "hasattr(backend, 'table_dtypes')\n"
    "if 'apply_if' in accepted: pass\n"  # a method's parameters: passes
    "inspect.signature(type(opt).__init__)\n"  # an optimizer's: passes
  )
  assert sorted(line for line, _ in _option_probes(source)) == [1, 2, 3, 4]


# -- backend names: only the registry compares them ----------------------------

REGISTRY = os.path.join(ROOT, "backends", "registry.py")


def _backend_names():
  """The registered backend names: the registry's literal map (read from
  its source, nothing imported) and any installed entry points."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  with open(REGISTRY, encoding="utf-8") as f:
    tree = ast.parse(f.read(), REGISTRY)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == (
      "_BUILTIN"
    ):
      names.update(ast.literal_eval(node.value))
  assert names, "backends/registry.py has no _BUILTIN map"
  names.update(ep.name for ep in metadata.entry_points(group="recsys.backends"))
  return names


def _strings(node):
  """String constants of `node` itself, or of a tuple/list/set literal."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    yield node
  elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    for element in node.elts:
      yield from _strings(element)


def _names_compared(source, names, path="<source>"):
  """(line, what, name) for each backend name the source decides on: an
  operand of a comparison (alone or in a tuple/list/set literal), a dict
  key, a subscript key, a `case` value. Names in messages, in a backend's
  own `name = ...` and in calls are not decisions and pass."""
  found = []
  for node in ast.walk(ast.parse(source, path)):
    if isinstance(node, ast.Compare):
      used = [
        ("compared", s)
        for o in [node.left, *node.comparators]
        for s in _strings(o)
      ]
    elif isinstance(node, ast.Dict):
      used = [("a dict key", s) for k in node.keys if k for s in _strings(k)]
    elif isinstance(node, ast.Subscript):
      used = [("a subscript", s) for s in _strings(node.slice)]
    elif isinstance(node, ast.MatchValue):
      used = [("a case", s) for s in _strings(node.value)]
    else:
      continue
    found += [(s.lineno, what, s.value) for what, s in used if s.value in names]
  return sorted(found)


def test_only_the_registry_decides_on_a_backend_name():
  """Code outside `backends/registry.py` asks what a backend does (its
  `capabilities`, `options`, `plan_tables`, a registry function), never
  which one it is: a registered name compared, keyed or matched on is
  refused, naming file:line (docs/architecture.md, "Layers")."""
  names = _backend_names()
  bad = []
  for path in sorted({**RECSYS, **BACKENDS}.values()):
    if os.path.samefile(path, REGISTRY):
      continue
    with open(path, encoding="utf-8") as f:
      source = f.read()
    bad += [
      f"{os.path.relpath(path, ROOT)}:{line}: {name!r} {what}"
      for line, what, name in _names_compared(source, names, path)
    ]
  assert not bad, (
    "a backend name decided on outside backends/registry.py (ask the "
    f"backend or the registry instead): {bad}"
  )


def test_no_command_names_a_backend():
  """`recsys/cli/` asks the registry (`for_export`, `decide`, ...) for a
  backend: no registered name stands alone as a string there, naming
  file:line (a name inside a help text or message passes)."""
  names = _backend_names()
  bad = []
  for module, path in sorted(RECSYS.items()):
    if not _under(module, "recsys.cli"):
      continue
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    bad += [
      f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.value!r}"
      for node in ast.walk(tree)
      if isinstance(node, ast.Constant) and node.value in names
    ]
  assert not bad, f"a command names a backend (ask the registry): {bad}"


def test_the_name_check_sees_a_decision_and_passes_a_message():
  """The scan itself: decisions on a name are caught, mentions are not."""
  source = (
    "if backend == 'parameter_servers':\n"  # 1
    "  pass\n"
    "ok = name not in ('auto', 'tensorcore')\n"  # 3
    "options = {'serving': 1}\n"  # 4
    "x = table['parameter_servers']\n"  # 5
    "match name:\n"
    "  case 'tpu_embedding':\n"  # 7
    "    pass\n"
    "name = 'parameter_servers'\n"  # a backend's own name: passes
    "raise ValueError(\"use 'tensorcore' instead\")\n"  # a message: passes
    "create(backend='serving')\n"  # a call: passes
    "if placement == 'row_sharded': pass\n"  # not a backend name
  )
  names = {"parameter_servers", "tensorcore", "serving", "tpu_embedding"}
  assert [(line, name) for line, _, name in _names_compared(source, names)] == [
    (1, "parameter_servers"),
    (3, "tensorcore"),
    (4, "serving"),
    (5, "parameter_servers"),
    (7, "tpu_embedding"),
  ]


def test_export_and_evaluation_load_no_training_module():
  """Importing the export, the restored run's evaluation, the gin-configured
  `train` and the evaluate and export commands, and registering every gin
  name, in a fresh interpreter, loads nothing of `recsys.training` (what the
  layer table promises, checked on the modules Python actually loads;
  tests/test_cli.py runs the two commands)."""
  code = (
    "import sys\n"
    "import recsys.serving.export, recsys.run.evaluation, recsys.run.restored\n"
    "import recsys.run.configured, recsys.cli.evaluate, recsys.cli.export\n"
    "from recsys import config\n"
    "config.register_all()  # every gin name, `train` included\n"
    "print(sorted(m for m in sys.modules "
    "if m == 'recsys.training' or m.startswith('recsys.training.')))\n"
  )
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run(
    [sys.executable, "-c", code],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=True,
    timeout=300,
  )
  assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


# -- backend families: the floor never imports one -----------------------------

# The folders of backends/ that hold one family each (docs/architecture.md,
# "The folders"). The floor (`backends/*.py`) and the shared storage
# (`backends/storage/`) never import one; only the registry, which names the
# backends, reaches into them.
FAMILIES = (
  "backends.tensorcore",
  "backends.parameter_servers",
  "backends.mid_level",
)
# What a family may import of another: the parameter servers compose the
# TensorCore family's machinery (composed, engines) with their own storage.
FAMILY_IMPORTS = {"backends.parameter_servers": ("backends.tensorcore",)}


@pytest.mark.parametrize("module", sorted(BACKENDS))
def test_the_floor_never_imports_a_family(module):
  own = next((f for f in FAMILIES if _under(module, f)), None)
  allowed = {own, *FAMILY_IMPORTS.get(own, ())} if own else set()
  if module == "backends.registry":  # the one module naming the backends
    allowed = set(FAMILIES)
  bad = [
    f"line {line}: {name}"
    for line, name in _imports(BACKENDS[module])
    for family in FAMILIES
    if _under(name, family) and family not in allowed
  ]
  assert not bad, f"{module} imports a family it may not: {bad}"
