"""Each setting's valid values, declared once next to it, and the one check.

A configurable's parameter declares what it takes in its annotation, e.g.
`num_cross_layers: Annotated[int, Int(1)] = 3` (or an alias below:
`num_cross_layers: PositiveInt = 3`); `X | None` in the annotation also
takes None. `declared(target)` reads the declarations of a class's
`__init__`, a function or a dataclass's fields; `check` refuses a value
outside one with `SettingRangeError`, naming `configurable.parameter`, the
value and what it takes; `checked` runs it on every call, `check_fields`
on a dataclass. A value out of range used to be taken silently (a
negative `train.checkpoint_every` counted steps backwards forever) or
failed late, deep in TensorFlow.

No TensorFlow here: `recsys.gin_config.names.RANGES` holds the declarations
written down, and `recsys.gin_config.range_check` checks the gin files' values
against them before TensorFlow starts (`recsys train` and the other
commands) and after `recsys.config.parse` (Python callers); the
configurables check theirs again on every call (a value gin computes, a
Python caller's).

Example:
  >>> check("train.checkpoint_every", Int(0), -1)
  Traceback (most recent call last):
  SettingRangeError: train.checkpoint_every must be an integer >= 0, got -1.
"""

import dataclasses
import functools
import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from backends import suggest
from recsys.errors import SettingsError

#: The largest integer a setting may be unless it declares less: TF counts
#: steps, ids and sizes in int64.
INT64_MAX = 2**63 - 1
#: The largest magnitude of a number setting: TF computes in float32, which
#: holds no more (a larger one is inf there).
FLOAT32_MAX = 3.4028234663852886e38


class SettingRangeError(SettingsError):
  """A setting's value is outside its declared range (exit status 2)."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """What one setting takes. Subclasses say what (`accepts`, `describe`).

  Attributes:
    optional: None is valid too (set from an `X | None` annotation).
    note: what special values mean, for the refusal (e.g. "0: only at
      the end").
  """

  optional: bool = dataclasses.field(default=False, kw_only=True)
  note: str = dataclasses.field(default="", kw_only=True)

  def accepts(self, value: Any) -> bool:
    """Whether `value` is valid (None only when `optional`)."""
    if value is None:
      return self.optional
    return self._accepts(value)

  def _accepts(self, value: Any) -> bool:
    raise NotImplementedError

  def describe(self) -> str:
    """What the setting must be, e.g. "an integer >= 1 or None"."""
    text = self._describe()
    return f"{text} or None" if self.optional else text

  def _describe(self) -> str:
    raise NotImplementedError

  def __repr__(self) -> str:
    """The constructor call, without its defaults (as `recsys.gin_config.names`
    writes it)."""
    parts = []
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
      else:
        default = field.default
      if value != default:
        parts.append(f"{field.name}={value!r}")
    return f"{type(self).__name__}({', '.join(parts)})"


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return (
    isinstance(value, numbers.Real)
    and not isinstance(value, bool)
    and math.isfinite(value)
  )


@dataclasses.dataclass(frozen=True, repr=False)
class Int(Spec):
  """An integer (not a bool, not a float) from `lo` to `hi`, inclusive."""

  lo: int | None = None
  hi: int = INT64_MAX

  def _accepts(self, value: Any) -> bool:
    return (
      _is_int(value)
      and (self.lo is None or value >= self.lo)
      and value <= self.hi
    )

  def _describe(self) -> str:
    if self.lo is not None and self.hi != INT64_MAX:
      return f"an integer from {self.lo} to {self.hi}"
    if self.lo is not None:
      return f"an integer >= {self.lo}"
    if self.hi != INT64_MAX:
      return f"an integer <= {self.hi}"
    return "an integer"


@dataclasses.dataclass(frozen=True, repr=False)
class Real(Spec):
  """A finite number (an int will do; not a bool, NaN or inf) in a range,
  and at most `FLOAT32_MAX` in magnitude.

  `lo_open` / `hi_open`: the bound itself is not valid (> rather than >=).
  """

  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False

  def _accepts(self, value: Any) -> bool:
    if not _is_number(value) or abs(value) > FLOAT32_MAX:
      return False
    if self.lo is not None and (
      value < self.lo or (self.lo_open and value == self.lo)
    ):
      return False
    return self.hi is None or not (
      value > self.hi or (self.hi_open and value == self.hi)
    )

  def _describe(self) -> str:
    if self.lo is not None and self.hi is not None:
      return (
        f"a number in {'(' if self.lo_open else '['}{self.lo:g}, "
        f"{self.hi:g}{')' if self.hi_open else ']'}"
      )
    if self.lo is not None:
      return f"{'>' if self.lo_open else '>='} {self.lo:g}"
    if self.hi is not None:
      return f"{'<' if self.hi_open else '<='} {self.hi:g}"
    return "a finite number"


@dataclasses.dataclass(frozen=True, repr=False)
class Bool(Spec):
  """True or False (not 0, 1 or a string)."""

  def _accepts(self, value: Any) -> bool:
    return isinstance(value, bool)

  def _describe(self) -> str:
    return "True or False"


@dataclasses.dataclass(frozen=True, repr=False)
class Choice(Spec):
  """One of `values` (of the same type: the string 'True' is not True)."""

  values: tuple[Any, ...] = ()

  def _accepts(self, value: Any) -> bool:
    return any(type(value) is type(v) and value == v for v in self.values)

  def _describe(self) -> str:
    return "one of " + ", ".join(repr(v) for v in self.values)


@dataclasses.dataclass(frozen=True, repr=False)
class Text(Spec):
  """A string (free text: a name, a path); not empty unless `empty`."""

  empty: bool = False

  def _accepts(self, value: Any) -> bool:
    return isinstance(value, str) and (self.empty or bool(value))

  def _describe(self) -> str:
    return "a string" if self.empty else "a non-empty string"


@dataclasses.dataclass(frozen=True, repr=False)
class Each(Spec):
  """A list or tuple of `min_len` to `max_len` items, each valid for
  `item`."""

  item: Spec = dataclasses.field(default_factory=lambda: Int())
  min_len: int = 0
  max_len: int | None = None

  def _accepts(self, value: Any) -> bool:
    return (
      isinstance(value, (list, tuple))
      and len(value) >= self.min_len
      and (self.max_len is None or len(value) <= self.max_len)
      and all(self.item.accepts(v) for v in value)
    )

  def _describe(self) -> str:
    item = self.item.describe()
    if self.max_len is not None and self.max_len == self.min_len:
      return f"a list of {self.min_len} items, each {item}"
    if self.min_len:
      return f"a list of {self.min_len} or more items, each {item}"
    return f"a list whose items are each {item}"


@dataclasses.dataclass(frozen=True, repr=False)
class AnyOf(Spec):
  """Valid for one of `options` (e.g. a number or a schedule's name)."""

  options: tuple[Spec, ...] = ()

  def _accepts(self, value: Any) -> bool:
    return any(option.accepts(value) for option in self.options)

  def _describe(self) -> str:
    return " or ".join(option.describe() for option in self.options)


@dataclasses.dataclass(frozen=True, repr=False)
class PerName(Spec):
  """A dict from names (non-empty strings) to values valid for `value`
  (e.g. table name -> placement)."""

  value: Spec = dataclasses.field(default_factory=lambda: Text())

  def _accepts(self, value: Any) -> bool:
    return isinstance(value, Mapping) and all(
      isinstance(k, str) and k and self.value.accepts(v)
      for k, v in value.items()
    )

  def _describe(self) -> str:
    return f"a dict name -> {self.value.describe()}"


#: The specs `recsys.gin_config.names` may write down, by name.
SPECS = (Int, Real, Bool, Choice, Text, Each, AnyOf, PerName)

# -- the common declarations ---------------------------------------------------

PositiveInt = Annotated[int, Int(1)]
NonNegativeInt = Annotated[int, Int(0)]
#: A random seed: NumPy and TensorFlow take 0 to 2**32 - 1.
Seed = Annotated[int, Int(0, 2**32 - 1)]
Flag = Annotated[bool, Bool()]
Name = Annotated[str, Text()]
Positive = Annotated[float, Real(0, lo_open=True)]
NonNegative = Annotated[float, Real(0)]
AnyNumber = Annotated[float, Real()]
Fraction = Annotated[float, Real(0, 1)]
#: Layer sizes, hidden widths: positive integers, any number of them.
LayerSizes = Annotated[Sequence[int], Each(Int(1))]
#: Top-k cut-offs of the hit rates: at least one positive integer.
Cutoffs = Annotated[Sequence[int], Each(Int(1), min_len=1)]
#: Feature names.
Names = Annotated[Sequence[str], Each(Text())]

# -- reading and checking the declarations -------------------------------------


def _spec_of(annotation: Any) -> Spec | None:
  """The spec an annotation declares (`Annotated[T, spec]`, or a union of
  one with None, which makes it optional); None: none declared."""
  if typing.get_origin(annotation) is Annotated:
    spec = next(
      (m for m in annotation.__metadata__ if isinstance(m, Spec)), None
    )
    if spec is None:
      return None
    base = typing.get_args(annotation)[0]
    if type(None) in typing.get_args(base):
      spec = dataclasses.replace(spec, optional=True)
    return spec
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    args = typing.get_args(annotation)
    for arg in args:
      spec = _spec_of(arg)
      if spec is not None:
        return dataclasses.replace(spec, optional=type(None) in args)
  return None


def _function(target: Any) -> Callable[..., Any]:
  return target.__init__ if inspect.isclass(target) else target


def declared(target: Any) -> dict[str, Spec]:
  """`{parameter: spec}` of what `target` declares: a class's `__init__`
  parameters, a function's, a dataclass's fields; and, for a function
  that passes its parameters on to a dataclass (`checked(fields_of=)`),
  that dataclass's fields of the same names."""
  specs: dict[str, Spec] = {}
  if dataclasses.is_dataclass(target) and isinstance(target, type):
    hints = typing.get_type_hints(target, include_extras=True)
    for field in dataclasses.fields(target):
      spec = _spec_of(hints.get(field.name))
      if spec is not None:
        specs[field.name] = spec
    return specs
  function = _function(target)
  try:
    parameters = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):
    return specs
  fields_of = getattr(function, "__ranges_fields_of__", None)
  from_fields = declared(fields_of) if fields_of is not None else {}
  for parameter in parameters:
    spec = _spec_of(parameter.annotation)
    if spec is None:
      spec = from_fields.get(parameter.name)
    if spec is not None:
      specs[parameter.name] = spec
  return specs


def _shown(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def _choices(spec: Spec) -> list[str]:
  """The text values a spec (or its options) names, for a did-you-mean."""
  if isinstance(spec, Choice):
    return [v for v in spec.values if isinstance(v, str)]
  if isinstance(spec, AnyOf):
    return [c for option in spec.options for c in _choices(option)]
  return []


def refusal(where: str, spec: Spec, value: Any) -> str:
  """The message refusing `value` for `where` ("DCNv2.num_cross_layers"),
  with the closest valid choice to a misspelt one."""
  note = f" ({spec.note})" if spec.note else ""
  hint = (
    suggest.did_you_mean(value, _choices(spec))
    if isinstance(value, str)
    else ""
  )
  return f"{where} must be {spec.describe()}{note}, got {_shown(value)}.{hint}"


def check(where: str, spec: Spec, value: Any) -> None:
  """Refuses `value` unless `spec` accepts it.

  Raises:
    SettingRangeError: naming `where`, what it takes and the value.
  """
  if not spec.accepts(value):
    raise SettingRangeError(refusal(where, spec, value))


def check_all(name: str, specs: Mapping[str, Spec], values: Mapping) -> None:
  """`check` of each value whose parameter declares a spec (`name.param`)."""
  for parameter, value in values.items():
    spec = specs.get(parameter)
    if spec is not None:
      check(f"{name}.{parameter}", spec, value)


def check_fields(instance: Any, name: str | None = None) -> None:
  """`check` of every declared field of a dataclass instance (call it in
  `__post_init__`); `name`: how the errors name it (the class's name)."""
  cls = type(instance)
  specs = _declared_cached(cls)
  check_all(
    name or cls.__name__,
    specs,
    {parameter: getattr(instance, parameter) for parameter in specs},
  )


_DECLARED: dict[Any, dict[str, Spec]] = {}


def _declared_cached(target: Any) -> dict[str, Spec]:
  """`declared(target)`, read once per class or function."""
  if target not in _DECLARED:
    _DECLARED[target] = declared(target)
  return _DECLARED[target]


def checked(
  function: Callable[..., Any] | None = None,
  *,
  name: str | None = None,
  fields_of: type | None = None,
) -> Any:
  """Decorates a function or `__init__`: its declared parameters are
  checked on every call, before its body runs.

  Args:
    function: what to decorate (as a plain `@checked`).
    name: how errors name the configurable (default: the class of an
      `__init__`, else the function's name), e.g. "train".
    fields_of: a dataclass whose fields declare the parameters of the same
      name (`train` passes them on to `TrainSettings`).
  """

  def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
    owner = (
      name or function.__qualname__.rpartition(".")[0] or function.__name__
    )
    owner = owner.rpartition(".")[2]
    signature = inspect.signature(function)
    if fields_of is not None:
      function.__ranges_fields_of__ = fields_of  # type: ignore[attr-defined]

    @functools.wraps(function)
    def with_checks(*args: Any, **kwargs: Any) -> Any:
      try:
        bound = signature.bind(*args, **kwargs)
      except TypeError:
        return function(*args, **kwargs)  # its own error for a bad call
      check_all(owner, _declared_cached(function), bound.arguments)
      return function(*args, **kwargs)

    # gin reads the parameters (which are required, which exist) with
    # `inspect.getfullargspec`, which follows no wrapper: the signature.
    with_checks.__signature__ = signature  # type: ignore[attr-defined]
    return with_checks

  return decorate(function) if function is not None else decorate


__all__ = [
  "AnyOf",
  "Bool",
  "Choice",
  "Each",
  "Int",
  "PerName",
  "Real",
  "SettingRangeError",
  "Spec",
  "Text",
  "check",
  "check_fields",
  "checked",
  "declared",
]
