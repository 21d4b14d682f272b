"""Every setting's valid range is declared once and checked before any work.

A hostile-probe round (issue 55) found settings taken silently:
`train.checkpoint_every = -1` counted the loop's steps backwards forever,
`train.eval_steps = 0` trained and then blamed the data. Every parameter
of every recsys configurable now declares its range next to it
(`recsys.ranges`); this walk enumerates the declarations, so a new
setting without one fails here, and feeds each hostile values: the
configurable refuses them when called (before its body: nothing is
built), and `recsys train` refuses them before TensorFlow starts, in one
line naming the setting, with exit status 2. A value a declaration
accepts (0 for `train.eval_every`: "only at the end") is left out: the
declarations say which.
"""

import dataclasses
import inspect
import io
import math
import time
import types
import typing
from contextlib import redirect_stderr

import pytest

from recsys import cli, config, ranges
from recsys.cli import COMMANDS, flags
from recsys.gin_config import compat as gin_compat
from recsys.gin_config import names as gin_names
from recsys.gin_config import range_check as gin_range_check
from recsys.tools import gin_names as gin_names_tool

#: What a hostile user binds: zero, negative, not a number, infinite,
#: larger than an int64 and than a float32, text, a float for an int, a
#: bool for an int, nothing, empty and wrong lists.
HOSTILE = (
  0,
  -1,
  float("nan"),
  float("inf"),
  10**30,
  10**40,
  "x",
  "",
  1.5,
  True,
  None,
  [],
  [0],
  {"t": 0},
)

#: Gin spells these values so (NaN has no gin literal: the walk through
#: the configurables takes it).
GIN = {
  "inf": "1e999",
  "nan": None,
}

PLAIN = (int, float, bool, str)


def _own_configurables():
  config.register_all()
  for selector in sorted(gin_compat.registered_selectors()):
    if selector.startswith(("recsys.", "backends.")):
      yield selector, gin_compat.find_configurable(selector)


def _plain(parameter: inspect.Parameter) -> bool:
  """Whether a parameter takes a number, bool or text (so must declare)."""
  if isinstance(parameter.default, PLAIN):
    return True
  annotation = parameter.annotation
  if typing.get_origin(annotation) is typing.Annotated:
    annotation = typing.get_args(annotation)[0]
  options = (
    typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType)
    else (annotation,)
  )
  return any(o in PLAIN for o in options)


def test_every_plain_parameter_of_every_configurable_declares_a_range():
  missing = []
  for selector, target in _own_configurables():
    function = target.__init__ if inspect.isclass(target) else target
    declared = ranges.declared(target)
    for parameter in inspect.signature(function).parameters.values():
      if parameter.name != "self" and _plain(parameter):
        if parameter.name not in declared:
          missing.append(f"{selector}.{parameter.name}")
  assert not missing, (
    "declare these settings' ranges where they are (recsys.ranges, e.g. "
    f"`name: ranges.PositiveInt = 3`): {missing}"
  )


def test_the_declarations_written_down_are_the_live_ones():
  """What the CLI checks before TF starts is what the code declares."""
  assert gin_names.RANGES == gin_names_tool.ranges_of(), (
    "recsys/gin_config/names.py is stale: run python -m recsys.tools.gin_names"
  )
  own = [s for s in gin_names.RANGES if s.startswith("recsys.")]
  assert len(own) >= 15
  assert sum(len(gin_names.RANGES[s]) for s in own) >= 150


def test_every_default_is_within_its_declared_range():
  for selector, target in _own_configurables():
    function = target.__init__ if inspect.isclass(target) else target
    parameters = inspect.signature(function).parameters
    factories = {
      f.name: f.default_factory
      for f in getattr(target, "__dataclass_fields__", {}).values()
      if f.default_factory is not dataclasses.MISSING
    }
    for name, spec in ranges.declared(target).items():
      default = parameters[name].default
      if name in factories:
        default = factories[name]()
      if default is not inspect.Parameter.empty:
        assert spec.accepts(default), (selector, name, default, spec)


def _settings():
  """`(selector, the gin name, parameter, spec)` of every declared setting
  (recsys's own by their class's name; TF's, `config.EXTERNAL_RANGES`, as
  registered: `embedding.SGD`)."""
  for selector, specs in sorted(gin_names.RANGES.items()):
    own = selector.startswith(("recsys.", "backends."))
    name = selector.rpartition(".")[2] if own else selector
    for parameter, spec in specs.items():
      yield selector, name, parameter, spec


def _refused(spec):
  return [v for v in HOSTILE if not spec.accepts(v)]


def test_no_declaration_takes_nan_inf_or_more_than_a_float32():
  for _, name, parameter, spec in _settings():
    for value in (float("nan"), float("inf"), -float("inf"), 10**40):
      assert not spec.accepts(value), (name, parameter, value)


def _example(spec):
  """A value `spec` accepts (for the arguments a call must have)."""
  if isinstance(spec, ranges.Int):
    return spec.lo if spec.lo is not None else 0
  if isinstance(spec, ranges.Real):
    return (spec.lo or 0) + (1 if spec.lo_open else 0)
  if isinstance(spec, ranges.Choice):
    return spec.values[0]
  if isinstance(spec, ranges.Each):
    return [_example(spec.item)] * spec.min_len
  if isinstance(spec, ranges.AnyOf):
    return _example(spec.options[0])
  return {ranges.Bool: True, ranges.PerName: {}}.get(type(spec), "x")


def _call_with(target, parameter, value):
  """Calls `target` with `parameter=value` and the arguments it needs."""
  function = target.__init__ if inspect.isclass(target) else target
  specs = ranges.declared(target)
  arguments = {}
  for other in inspect.signature(function).parameters.values():
    needed = other.default is inspect.Parameter.empty or (
      other.default is _gin_compat_required()
    )
    if other.name == "self" or other.kind is other.VAR_KEYWORD:
      continue
    if needed and other.name != parameter:
      spec = specs.get(other.name)
      arguments[other.name] = _example(spec) if spec is not None else None
  arguments[parameter] = value
  return target(**arguments)


def _gin_compat_required():
  import gin  # pylint: disable=g-import-not-at-top

  return gin.REQUIRED


def test_every_configurable_refuses_hostile_values_before_its_body():
  """Python callers (and values gin computes) meet the same declarations:
  the call refuses before it builds or reads anything."""
  checked = 0
  for selector, target in _own_configurables():
    for parameter, spec in ranges.declared(target).items():
      for value in _refused(spec):
        with pytest.raises(ranges.SettingRangeError) as e:
          _call_with(target, parameter, value)
        message = str(e.value)
        assert f".{parameter} must be" in message, (selector, message)
        assert "\n" not in message
        checked += 1
  assert checked > 1000


def _gin(value) -> str | None:
  if isinstance(value, float) and not math.isfinite(value):
    return GIN["nan" if math.isnan(value) else "inf"]
  return repr(value)


def test_the_checks_before_tf_refuse_every_hostile_gin_value():
  """Every hostile value of every setting, as `recsys.gin_config.range_check` reads
  the gin bindings (the command's own run is timed below)."""
  checked = 0
  for _, name, parameter, spec in _settings():
    for value in _refused(spec):
      text = _gin(value)
      if text is None:
        continue
      binding = f"{name}.{parameter} = {text}"
      assert gin_range_check.problems([], [binding]) == [
        f"--gin_bindings {binding!r}: "
        + ranges.refusal(f"{name}.{parameter}", spec, value)
      ]
      checked += 1
  assert checked > 1000


def test_recsys_train_refuses_each_setting_in_one_line_before_tensorflow(
  tmp_path,
):
  """One hostile value per setting through the command (in turn: each
  kind of value is met), timed: a refusal, never a run."""
  model_dir = tmp_path / "run"
  slowest = 0.0
  for index, (_, name, parameter, spec) in enumerate(_settings()):
    values = [v for v in _refused(spec) if _gin(v) is not None]
    value = values[index % len(values)]
    binding = f"{name}.{parameter} = {_gin(value)}"
    err = io.StringIO()
    start = time.monotonic()
    with redirect_stderr(err):
      code = cli.main(
        [
          "train",
          "--gin_file",
          "synthetic_dlrm.gin",
          "--model_dir",
          str(model_dir),
          "--gin_bindings",
          binding,
        ]
      )
    slowest = max(slowest, time.monotonic() - start)
    lines = err.getvalue().splitlines()
    assert code == 2, (binding, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
      f"recsys train: SettingRangeError: --gin_bindings {binding!r}: "
      f"{name}.{parameter} must be"
    ), lines
  assert slowest < 2.0
  assert not model_dir.exists()  # nothing ran


def _numeric_flags():
  """`(command, option, action)` of every flag of a number (launch's own
  flags are recsys.launch's)."""
  parser = cli.build_parser()
  subparsers = next(
    a
    for a in parser._actions
    if a.dest == "command"  # noqa: SLF001
  )
  for command, sub in subparsers.choices.items():
    if command == "launch":
      continue
    for action in sub._actions:  # noqa: SLF001
      if action.type is not None or (
        isinstance(action.default, PLAIN) and action.nargs is None
      ):
        if not isinstance(action.default, bool) and action.option_strings:
          yield command, action.option_strings[-1], action


def test_every_numeric_flag_declares_its_range_and_refuses_hostile_values(
  capsys,
):
  seen = 0
  for command, option, action in _numeric_flags():
    if action.choices is not None or action.type in (None, str):
      continue  # argparse's choices, or free text (a path, a name)
    assert isinstance(action.type, flags.Ranged), (command, option)
    seen += 1
    for text in ("-1", "nan", "inf", str(10**30), "x", "1.5"):
      if text == "-1" and action.type.spec.accepts(-1):
        continue
      with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args([command, option, text])
      assert e.value.code == 2
      assert f"argument {option}: {text!r} is not" in capsys.readouterr().err
  assert seen >= 3  # the thread counts (train, ...) and --k
  assert set(COMMANDS) >= {"train", "evaluate", "export", "info"}
