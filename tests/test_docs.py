"""Every code block of README.md and docs/*.md runs as written.

A page's blocks run in order, in a scratch folder (shared by the pages of
one test session) that holds what a reader's checkout holds
(`experiments/`) and small stand-ins for the data folders the pages name
(`data/ml-100k` in GroupLens's layout, `data/criteo` with `train.txt` and
`eval.txt`). A `recsys` command that an earlier page already ran there, word
for word, is not run again (pages repeat the commands they build on); two
different commands may not train into one model dir.

  python  executed as a script of its own, as a reader who copies it into
          a file runs it: it imports what it uses, and what it prints is
          what the reader sees (a block must print something, unless a
          later block continues it or SILENT says why not; a top-level
          expression left bare, which a script drops, is refused). A block
          whose prose just before it says that it continues the block above
          (CONTINUES) runs in that block's namespace, as one script;
  sh      `recsys ...` commands run in this process (`recsys.cli.main`)
          with their files, flags and paths as written, and `recsys train`
          with bindings appended that cut training to a few steps (the
          defaults train for minutes); other commands run in bash; a block
          does not mix the two;
  gin     parsed as `recsys train --gin_file` would, and what it binds
          to `train` built (data source, model class, optimizers);
  toml    parsed;
  text    output, diagrams, messages: not code.

docs/benchmarks.md's blocks are benchmark runs (minutes each, some in a
torch venv; tests/benchmarks/ runs each script on a tiny workload): each
command is checked, not run: `make X` names a Makefile target, and
`python benchmarks/S.py ...` names a script whose argument parser accepts
the flags and values as written (its implementation names too), with a
page's placeholders (W, T, N) replaced by the first value its table gives;
a line starting with `...` repeats the command above it with other flags.

A block indented inside a list item is dedented first. Where a page
imports a reader's own package (docs/architecture.md's `my_package`, a
third-party backend), STAND_INS provides it.

A block that cannot run here is listed in NOT_RUN with the reason (and,
where one exists, the test that runs its equivalent); an entry that no
longer matches a block fails, so the list stays true.
"""

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import types

import gin
import numpy as np
import pytest

from recsys import cli, config
from recsys.testing.movielens import write_ml100k_like

try:
  import tomllib
except ImportError:  # Python 3.10: toml blocks are not parsed there
  tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
  os.path.join("docs", name)
  for name in os.listdir(os.path.join(ROOT, "docs"))
  if name.endswith(".md")
)
LANGUAGES = ("python", "sh", "gin", "toml", "text")
README_MAX_LINES = 250

#: (page, text the block contains) -> why it does not run here.
NOT_RUN = {
  ("README.md", "make demo"): (
    "creates .venv/ and trains 6,000 steps; CI runs `make test` itself "
    "(.ci/run), and docs/experiments.md runs the demo's command"
  ),
  ("README.md", "model.fit(ratings.take(80_000)"): (
    "tests/layers/test_readme_examples.py::test_readme_keras_example_learns_"
    "its_planted_signal runs it after the model block, as its prose says, "
    "and checks the RMSE it prints"
  ),
  ("README.md", "Trainer("): (
    "tests/layers/test_readme_examples.py::test_readme_trainer_example_"
    "learns_and_runs_again runs it as a script, twice, and checks what it "
    "prints and writes"
  ),
  ("docs/models.md", "movielens_ials.gin"): (
    "tests/test_ials_run.py runs `recsys train` with this gin file, resumes, "
    "evaluates and runs `recsys export` on synthetic ml-100k-like files"
  ),
  ("docs/experiments.md", "hardware/cpu_2replicas.gin \\"): (
    "two mirrored replicas need a process whose TensorFlow runtime has not "
    "started: tests/test_cli.py::test_train_evaluate_export_and_serve_in_"
    "a_fresh_process runs this command in a fresh process"
  ),
  ("docs/experiments.md", "tensorboard --logdir"): (
    "starts a web server; tests/training/test_resume_settings.py::"
    "test_operative_config_is_a_text_summary_and_hparams reads the files "
    "it shows"
  ),
  ("docs/data.md", "pip download recbole"): (
    "downloads from PyPI; tests/data/test_movielens.py::test_atomic_files_"
    "read_like_grouplens reads RecBole's atomic files"
  ),
  ("docs/data.md", "write_ml100k_like('data/ml-100k')"): (
    "the scratch folder's data/ml-100k is written by this function (fewer "
    "users, movies and ratings): every MovieLens command of the pages reads it"
  ),
  ("docs/movielens_tuning.md", "recsys benchmark movielens"): (
    "trains every MovieLens experiment on 5 split seeds (minutes); "
    "tests/test_cli.py::test_benchmark_movielens_runs_as_a_user_runs_it "
    "runs it on generated data"
  ),
  ("docs/reliability.md", "--eval_on seed1"): (
    "needs the run runs/fm trained on MovieLens; tests/reliability/"
    "test_run_drift.py::test_eval_on_other_data_writes_its_own_results runs "
    "this command on a trained run"
  ),
  ("docs/retrieval.md", "top_k_raw"): (
    "the export it loads is docs/serving.md's, whose example makes the same "
    "top_k_raw call after training and exporting it"
  ),
  ("docs/backends.md", "recsys.tools.tpu_smoke"): (
    "needs a Cloud TPU; tests/tools/test_tpu_smoke.py runs its CPU side"
  ),
  ("docs/scaling.md", "--model_dir runs/row_sharded"): (
    "traces the default DLRM on 4 replicas (a minute here, even for 2 steps); "
    "tests/distributed/test_row_sharded_training.py::test_recsys_train_"
    "prints_the_plan_and_trains_sharded runs `recsys train` with the same "
    "flags on 4 replicas and a smaller DLRM, and the `recsys info` block "
    "above runs this plan as written"
  ),
  ("docs/scaling.md", "--model_dir runs/ps"): (
    "starts clusters of 3 to 5 TensorFlow processes for minutes; "
    "tests/distributed/test_cluster.py launches the same clusters"
  ),
  ("docs/scaling.md", "--model_dir runs/workers_row_sharded"): (
    "starts 2 TensorFlow worker processes for a minute; tests/distributed/"
    "test_row_sharded_cluster.py launches this cluster with the same gin "
    "files (fewer steps), and the `recsys info` block above prints its plan"
  ),
  ("docs/testing.md", "make test-fast"): "runs the test suite itself",
}
#: Prose just before a Python block saying it continues the one above.
CONTINUES = re.compile(r"continu\w* the (?:python )?block above", re.I)
#: (page, text the block contains) -> why it prints nothing.
SILENT = {
  ("docs/architecture.md", "def test_conformance"): (
    "a reader's pytest module: pytest reports its checks"
  ),
}
#: A reader's own modules the pages import -> what stands in for them.
STAND_INS = {
  "my_package.backend": {
    "MyBackend": "backends.tensorcore.backend:TensorCoreEmbedding"
  }
}
#: Pages whose commands are benchmark runs: checked, not run.
BENCHMARK_PAGES = {"docs/benchmarks.md"}
#: Placeholders of the benchmark pages -> the first value their tables give.
PLACEHOLDERS = {"W": "8", "T": "1", "N": "16384"}

#: Appended to every `recsys train`: a few steps of small batches, small
#: Criteo tables; the gin files, flags and paths stay as written.
FEW_STEPS = [
  "train.global_batch_size = 32",
  "train.eval_batch_size = 32",
  "train.train_steps = 2",
  "train.steps_per_loop = 2",
  "train.eval_steps = 1",
  "train.eval_every = 0",
  "train.checkpoint_every = 0",
  # Read by the experiments of their source only (`# optional`: a binding
  # nothing in a run reads is refused, recsys.gin_config.unread).
  "SyntheticCTR.oracle_examples = 4096  # optional",
  "CriteoTSV.max_vocab_size = 1000  # optional",
]
#: Slow pages train models; the others run in a second or two.
FAST_PAGES = {
  "docs/architecture.md",
  "docs/backends.md",
  "docs/benchmarks.md",
  "docs/optimizers.md",
}


@dataclasses.dataclass
class Block:
  page: str
  line: int  # of the opening fence, 1-based
  language: str
  text: str
  prose: str = ""  # the page's text between the previous block and this one

  def __str__(self) -> str:
    return f"{self.page}:{self.line} ({self.language})"

  @property
  def continues(self) -> bool:
    """Whether its prose says it continues the block above."""
    return bool(CONTINUES.search(" ".join(self.prose.split())))


def blocks(page: str) -> list[Block]:
  """The fenced code blocks of a page, in order."""
  out, opened, prose = [], None, ""
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      fence = re.match(r"^\s*```(\S*)\s*$", line)
      if fence and opened is None:
        opened = Block(page, number, fence.group(1), "", prose)
      elif fence:
        opened.text = textwrap.dedent(opened.text)
        out.append(opened)
        opened, prose = None, ""
      elif opened is not None:
        opened.text += line
      else:
        prose += line
  assert opened is None, (
    f"{page}: a code block opened at line {opened.line} never closes"
  )
  return out


def _reason(block: Block, listed: dict | None = None) -> str | None:
  for (page, marker), reason in (NOT_RUN if listed is None else listed).items():
    if page == block.page and marker in block.text:
      return reason
  return None


def _continued(page_blocks: list[Block]) -> set[int]:
  """The lines of the Python blocks that the next Python block continues."""
  python = [b for b in page_blocks if b.language == "python"]
  return {a.line for a, b in zip(python, python[1:]) if b.continues}


# -- the scratch folder --------------------------------------------------------


def _criteo_lines(n: int, seed: int) -> str:
  rng = np.random.default_rng(seed)
  lines = []
  for i in range(n):
    dense = [str(x) for x in rng.integers(0, 300, 13)]
    dense[i % 13] = ""
    cats = [f"{x:08x}" for x in rng.integers(0, 1 << 32, 26)]
    cats[(i * 7) % 26] = ""
    lines.append("\t".join([str(int(rng.random() < 0.3)), *dense, *cats]))
  return "\n".join(lines) + "\n"


def _workspace(folder) -> str:
  """What a reader's checkout holds, with small data where pages name it."""
  os.symlink(os.path.join(ROOT, "experiments"), folder / "experiments")
  write_ml100k_like(
    str(folder / "data" / "ml-100k"),
    num_users=200,
    num_items=250,
    num_ratings=3000,
  )
  criteo = folder / "data" / "criteo"
  criteo.mkdir(parents=True)
  (criteo / "train.txt").write_text(_criteo_lines(700, 0))
  (criteo / "eval.txt").write_text(_criteo_lines(100, 1))
  return str(folder)


# -- running blocks ------------------------------------------------------------


def _commands(text: str) -> list[list[str]]:
  """The block's commands as argv lists (continuations joined, comments cut)."""
  joined = re.sub(r"\\\n", " ", text)
  return [
    argv
    for line in joined.splitlines()
    if (argv := shlex.split(line, comments=True))
  ]


def _recsys_args(argv: list[str]) -> list[str] | None:
  """`recsys` arguments of a command line, or None if it is another command."""
  if argv[0] in ("recsys", ".venv/bin/recsys"):
    return argv[1:]
  if argv[1:3] == ["-m", "recsys"] and argv[0].endswith("python"):
    return argv[3:]
  return None


class Workspace:
  """The scratch folder, and the recsys commands already run in it."""

  def __init__(self, folder):
    self.path = _workspace(folder)
    self.ran: set[tuple[str, ...]] = set()
    self.trained: dict[str, tuple[str, ...]] = {}  # model dir -> command

  def recsys(self, args: list[str], block: Block) -> None:
    given = tuple(args)
    if given in self.ran:
      return
    if args[:1] == ["train"]:
      model_dir = args[args.index("--model_dir") + 1]
      other = self.trained.setdefault(model_dir, given)
      assert other == given, (
        f"{block}: trains into {model_dir}, which another block trains with "
        f"other settings ({' '.join(other)}): give it its own model dir"
      )
      args = args + sum((["--gin_bindings", b] for b in FEW_STEPS), [])
    out, err = io.StringIO(), io.StringIO()
    try:
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(args)
    except SystemExit as e:  # --help
      code = e.code
    finally:
      gin.clear_config()
    assert code == 0, (
      f"{block}: recsys {' '.join(args)} exited {code}:\n"
      f"{err.getvalue()[-3000:]}"
    )
    self.ran.add(given)


def _run_sh(block: Block, workspace: Workspace) -> None:
  commands = _commands(block.text)
  recsys = [_recsys_args(argv) for argv in commands]
  if all(args is not None for args in recsys):
    for args in recsys:
      workspace.recsys(args, block)
    return
  assert not any(recsys), f"{block}: mixes recsys and other commands; split it"
  done = subprocess.run(
    ["bash", "-euo", "pipefail", "-c", block.text],
    cwd=workspace.path,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 0, f"{block}:\n{done.stderr[-2000:]}"


class _Parsed(Exception):
  """Raised by a benchmark's parser once it has accepted the arguments."""

  def __init__(self, namespace):
    super().__init__()
    self.namespace = namespace


_PARSE_ARGS = argparse.ArgumentParser.parse_args


def _parse_then_stop(parser, args=None, namespace=None):
  raise _Parsed(_PARSE_ARGS(parser, args, namespace))


def _benchmark_commands(block: Block) -> list[list[str]]:
  """The block's commands, environment settings dropped, `...` expanded."""
  out: list[list[str]] = []
  for argv in _commands(block.text):
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
      argv = argv[1:]
    if argv[0] == "...":
      assert out, f"{block}: `...` with no command above it"
      script = next(i for i, a in enumerate(out[-1]) if a.endswith(".py"))
      argv = out[-1][: script + 1] + argv[1:]
    out.append([PLACEHOLDERS.get(a, a) for a in argv])
  return out


def _check_benchmark_sh(block: Block, monkeypatch) -> None:
  """A benchmark page's commands name what exists, with flags it accepts."""
  for argv in _benchmark_commands(block):
    if argv[0] == "make":
      with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        targets = re.findall(r"^([\w-]+):", f.read(), re.M)
      assert argv[1] in targets, f"{block}: no Makefile target {argv[1]!r}"
      continue
    assert argv[0] == "python" and argv[1].startswith("benchmarks/"), (
      f"{block}: not a benchmark command: {' '.join(argv)}"
    )
    path = os.path.join(ROOT, argv[1])
    assert os.path.isfile(path), f"{block}: {argv[1]} does not exist"
    with open(path, encoding="utf-8") as f:
      if "def main(argv" not in f.read():
        continue  # a script that reads sys.argv itself (kernel_ops_threads)
    monkeypatch.syspath_prepend(os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(
      "_doc_" + os.path.basename(path)[:-3], path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", _parse_then_stop)
    try:
      with pytest.raises(_Parsed) as parsed:
        module.main(argv[2:])
    except SystemExit as e:  # argparse printed why
      raise AssertionError(
        f"{block}: {argv[1]} refuses its arguments: {' '.join(argv[2:])}"
      ) from e
    finally:
      monkeypatch.setattr(argparse.ArgumentParser, "parse_args", _PARSE_ARGS)
    impls = getattr(parsed.value.namespace, "impls", None)
    if impls and hasattr(module, "IMPLS"):
      unknown = set(impls.split(",")) - set(module.IMPLS)
      assert not unknown, f"{block}: unknown --impls {sorted(unknown)}"


def _run_gin(block: Block, workspace: Workspace) -> None:
  """Parses the block as `recsys train --gin_file` would, folders bound, and
  builds what `train` would get: its data source, optimizers, schedules."""
  path = os.path.join(
    workspace.path, f"{os.path.basename(block.page)[:-3]}_{block.line}.gin"
  )
  with open(path, "w", encoding="utf-8") as f:
    f.write(block.text)
  folders = []
  for binding in (
    "MOVIELENS_DIR = 'data/ml-100k'",
    "CRITEO_DIR = 'data/criteo'",
  ):
    try:  # only the folders the block (or what it includes) reads
      config.check_macro_bindings([path], [binding])
      folders.append(binding)
    except config.GinConfigError:
      pass
  try:
    config.parse([path], folders)
    for name in ("data", "embedding_optimizer", "dense_optimizer", "model"):
      config.value(f"train.{name}")
  finally:
    gin.clear_config()


def _stand_ins(monkeypatch) -> None:
  for module_name, names in STAND_INS.items():
    module = types.ModuleType(module_name)
    for name, target in names.items():
      where, attribute = target.split(":")
      setattr(module, name, getattr(importlib.import_module(where), attribute))
    parts = module_name.split(".")
    for i in range(1, len(parts)):
      monkeypatch.setitem(
        sys.modules, ".".join(parts[:i]), types.ModuleType(parts[i - 1])
      )
    monkeypatch.setitem(sys.modules, module_name, module)


def _run_python(block: Block, namespace: dict, continued: bool) -> None:
  """Runs the block in `namespace`; it must print unless `continued` or
  SILENT."""
  out = io.StringIO()
  code = compile(block.text, f"{block.page}:{block.line}", "exec")
  with contextlib.redirect_stdout(out):
    exec(code, namespace)  # pylint: disable=exec-used
  sys.stdout.write(out.getvalue())
  assert out.getvalue().strip() or continued or _reason(block, SILENT), (
    f"{block}: prints nothing; a reader running it sees no result. Print "
    "what it computes, or continue it in the next block"
  )


def _run_page(page: str, workspace: Workspace, monkeypatch) -> None:
  namespace: dict = {}
  page_blocks = blocks(page)
  continued = _continued(page_blocks)
  previous = os.getcwd()
  os.chdir(workspace.path)
  try:
    for block in page_blocks:
      if block.language == "text" or _reason(block):
        continue
      if block.language == "python":
        if not block.continues:  # a script of its own
          namespace = {"__name__": "__main__"}
        _run_python(block, namespace, block.line in continued)
      elif block.language == "sh" and page in BENCHMARK_PAGES:
        _check_benchmark_sh(block, monkeypatch)
      elif block.language == "sh":
        _run_sh(block, workspace)
      elif block.language == "gin":
        _run_gin(block, workspace)
      elif block.language == "toml" and tomllib is not None:
        tomllib.loads(block.text)
  finally:
    os.chdir(previous)


# -- the tests -----------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
  return Workspace(tmp_path_factory.mktemp("docs"))


def _runs_something(page: str) -> bool:
  return any(b.language != "text" and not _reason(b) for b in blocks(page))


def _page_params():
  for page in PAGES:
    slow = page not in FAST_PAGES and _runs_something(page)
    yield pytest.param(page, id=page, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("page", _page_params())
def test_every_block_of_the_page_runs_as_written(page, workspace, monkeypatch):
  _stand_ins(monkeypatch)
  _run_page(page, workspace, monkeypatch)


def test_every_block_says_what_it_is_and_every_exception_is_used():
  found = [block for page in PAGES for block in blocks(page)]
  unlabelled = [str(b) for b in found if b.language not in LANGUAGES]
  assert not unlabelled, (
    f"code blocks without one of the languages {LANGUAGES}: {unlabelled}"
  )
  for name, listed in (("NOT_RUN", NOT_RUN), ("SILENT", SILENT)):
    for page, marker in listed:
      matches = [b for b in found if b.page == page and marker in b.text]
      assert len(matches) == 1, (
        f"{name} entry {(page, marker)} matches {len(matches)} blocks"
      )


def test_python_blocks_run_as_scripts_leave_no_result_unprinted():
  """A script drops a bare top-level expression (`scores["x"]  # [2]`) that
  an interactive session would show; a block that continues another says
  so just before it, and the first Python block of a page continues none.
  Checked without running, so blocks that NOT_RUN lists are checked too."""
  problems = []
  for page in PAGES:
    python = [b for b in blocks(page) if b.language == "python"]
    if python and python[0].continues:
      problems.append(f"{python[0]}: continues no block above it")
    for block in python:
      for node in ast.parse(block.text).body:
        bare = isinstance(node, ast.Expr) and not isinstance(
          node.value, (ast.Call, ast.Await, ast.Constant)
        )
        if bare:
          problems.append(
            f"{block}: line {block.line + node.lineno} computes "
            f"`{ast.unparse(node)[:60]}` and drops it: print it"
          )
  assert not problems, "\n".join(problems)


#: The commands a README reader has after the quick start, by the bare name
#: a page may use for them if it says so first: the venv's own.
VENV_COMMANDS = ("recsys", "python", "tensorboard")
#: A command to type in a page's prose: `recsys <subcommand> ...`,
#: `python -m ...`, `python benchmarks/...`.
PROSE_COMMAND = re.compile(
  r"`(recsys (?:train|evaluate|export|info|experiments|launch|benchmark)"
  r"|python (?:-m|benchmarks/))"
)


def _prose(page: str) -> str:
  """The page's text outside its code blocks."""
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    return re.sub(r"^\s*```.*?^\s*```", "", f.read(), flags=re.S | re.M)


def _says_first(page: str) -> str:
  """What a page says before its commands: the text between its title and
  its first section heading or code block; README.md's quick start."""
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    text = f.read()
  if page == "README.md":
    return text.split("\n## ")[1]
  lines = text.splitlines()[1:]
  for i, line in enumerate(lines):
    if line.startswith(("```", "#")):
      return "\n".join(lines[:i])
  return "\n".join(lines)


def test_every_command_is_written_as_a_readme_reader_types_it():
  """After the README's quick start `recsys train ...` is `command not
  found`: the venv's commands are `.venv/bin/recsys`, `.venv/bin/python`.
  A page writes them so, or says first what its bare names mean."""
  unclear = []
  for page in PAGES:
    used = set()
    for block in blocks(page):
      if block.language != "sh":
        continue
      for argv in _commands(block.text):
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
          argv = argv[1:]  # VAR=value before the command
        if argv and argv[0] in VENV_COMMANDS:
          used.add(argv[0])
    for match in PROSE_COMMAND.finditer(_prose(page)):
      used.add(match.group(1).split()[0])
    intro = _says_first(page)
    unclear += [
      f"{page}: `{name} ...` without saying that {name} is .venv/bin/{name}"
      for name in sorted(used)
      if f".venv/bin/{name}" not in intro
    ]
  assert not unclear, "\n".join(unclear)


def _extras_in_pyproject() -> set[str]:
  with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("[project.optional-dependencies]", 1)[1]
  section = re.split(r"^\[", section, maxsplit=1, flags=re.M)[0]
  return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


def test_the_readme_says_how_to_install_into_ones_own_project():
  """recsys is not on PyPI: the README gives `pip install /path/to/clone`
  and names the extras pyproject.toml has, each of them and no other
  (tests/test_packaging.py installs the wheel such a line builds)."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = " ".join(f.read().split())
  assert "`pip install /path/to/clone`" in text
  line = text[text.index("`pip install /path/to/clone`") :].split(")")[0]
  named = set()
  for group in re.findall(r"`[^`]*?\[([\w,-]+)\]\"?`", line):
    named.update(group.split(","))
  assert named == _extras_in_pyproject(), (line, _extras_in_pyproject())


def test_the_readme_is_short():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    assert len(f.read().splitlines()) <= README_MAX_LINES


def test_the_docs_links_lead_to_pages_that_exist():
  for page in PAGES:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
      text = f.read()
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
      path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
      assert os.path.isfile(path), f"{page} links to {target}, which is missing"
