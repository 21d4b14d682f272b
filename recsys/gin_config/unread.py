"""Gin bindings nothing in the run reads, named before TensorFlow starts.

Gin accepts a binding of any registered configurable and applies it only
when that configurable is called, in a scope the binding names: a
misspelt scope (`embeding_init/keras.initializers.RandomNormal.stddev`),
a parameter of a model the run does not train (`DCNv2.num_cross_layers`
in a DLRM run) or the learning rate of an optimizer it does not use
changed nothing, silently, and was absent from operative_config.gin.

This module follows the run as gin will call it, from the parsed files
and bindings (`recsys.gin_config.precheck.Config`), without running anything:
from `train` (and `CALLED_BY_RECSYS`), every reference of a binding it
reads (`@scope/Name` or `@scope/Name()`, called in that scope, nested in
the caller's) and every macro it uses, until nothing new is reached. A
binding of a configurable never reached, or reached only in other scopes,
is unread: named with where it is and what was probably meant. Not one
made for a choice a later binding replaced: `base.gin`'s Adagrad learning
rate when an experiment including it chooses Adam, a DLRM file's model
settings when the DCN file including it trains DCN-v2 (bound after the
replacement, it is named). A file that binds something on purpose for
only some runs (`hardware/cpu_small.gin`'s Criteo vocabulary cap) says so
with `# optional` on the binding's line; `--allow_unused_bindings` lets a
command go on with a warning.

Example:
  >>> check(["synthetic_dlrm.gin"], ["DCNv2.num_cross_layers = 7"])
  Traceback (most recent call last):
  UnreadGinBindingError: --gin_bindings 'DCNv2.num_cross_layers = 7':
  nothing in this run reads DCNv2.num_cross_layers (no binding the run
  reads references @DCNv2), so it changes nothing. Remove it, ...
"""

from collections.abc import Iterator, Sequence

from backends import suggest
from recsys.errors import SettingsError
from recsys.gin_config import names as gin_names
from recsys.gin_config import precheck as gin_precheck

#: The configurables recsys calls itself through gin, besides through gin
#: references, so that their (unscoped) bindings apply: `train` (a
#: `gin.configurable`, called by the commands) and `EmbeddingPlacement`
#: (`gin.get_configurable` in `planning.bound_placement`, when
#: `train.placement` is unbound). A registered class called directly
#: (`EmbeddingSettings()`) reads no binding. tests/test_setting_refusals.py
#: reads recsys's source for other such calls.
CALLED_BY_RECSYS = (
  "recsys.run.configured.train",
  "recsys.planning.EmbeddingPlacement",
)

#: How deep scopes may nest before the walk stops (a reference cycle).
_MAX_SCOPES = 8


class UnreadGinBindingError(SettingsError):
  """A gin binding that no configurable of the run reads (exit status 2):
  it would change nothing."""


#: A configurable called in a scope: `(full selector, scope components)`.
_Call = tuple[str, tuple[str, ...]]


class _Walk:
  """Which bindings gin would apply when it runs the config."""

  def __init__(self, config: gin_precheck.Config):
    self.known = gin_precheck.known_names()
    self.macros: dict[str, gin_precheck.Binding] = {}
    self.position = {id(b): i for i, b in enumerate(config.bindings)}
    # The binding gin applies of each (scope, configurable, parameter): the
    # last; one a later file or binding overrides is no mistake. What an
    # overridden one referenced (another model, optimizer) was the choice
    # of the bindings made before the override (`replaced`).
    last: dict[tuple[str, str, str], gin_precheck.Binding] = {}
    self.overridden: list[tuple[gin_precheck.Binding, int]] = []
    for index, binding in enumerate(config.bindings):
      full = self._resolve(binding.selector)
      if not binding.param:
        self.macros[binding.selector] = binding
      elif full is not None:
        key = (binding.scope, full, binding.param)
        if key in last:
          self.overridden.append((last[key], index))
        last[key] = binding
    self.by_selector: dict[str, list[gin_precheck.Binding]] = {}
    for (_, full, _), binding in last.items():
      self.by_selector.setdefault(full, []).append(binding)
    self.read: set[int] = set()  # ids of the bindings read
    self.calls: set[_Call] = set()
    for root in CALLED_BY_RECSYS:
      self._call(root, (), self.calls, set(), self.read)

  def replaced(self, binding: gin_precheck.Binding) -> bool:
    """Whether `binding` was made for a choice a later binding replaced:
    what an overridden binding referenced (`train.model = @DLRM`, then
    `@DCNv2` in the file that includes it) reaches it, and the override
    comes after it (a file's settings for the model it chose)."""
    full = self._resolve(binding.selector)
    parts = tuple(binding.scope.split("/")) if binding.scope else ()
    for old, at in self.overridden:
      if at < self.position[id(binding)]:
        continue  # bound after the choice was replaced: a mistake
      calls: set[_Call] = set()
      scope = tuple(old.scope.split("/")) if old.scope else ()
      self._value(old.value, scope, calls, set(), set())
      if any(f == full and s[: len(parts)] == parts for f, s in calls):
        return True
    return False

  def _resolve(self, name: str) -> str | None:
    matches = self.known.get(name, [])
    return matches[0] if len(matches) == 1 else None

  def _call(
    self,
    full: str,
    scope: tuple[str, ...],
    calls: set[_Call],
    macros: set[str],
    read: set[int],
  ) -> None:
    """`full` called in `scope`: its bindings of a prefix of the scope
    are read, and what their values reference is called in turn (into
    `calls`, `macros` used and `read` binding ids)."""
    if (full, scope) in calls or len(scope) > _MAX_SCOPES:
      return
    calls.add((full, scope))
    for binding in self.by_selector.get(full, []):
      parts = tuple(binding.scope.split("/")) if binding.scope else ()
      if scope[: len(parts)] == parts:
        read.add(id(binding))
        self._value(binding.value, scope, calls, macros, read)

  def _value(
    self,
    value: object,
    scope: tuple[str, ...],
    calls: set[_Call],
    macros: set[str],
    read: set[int],
  ) -> None:
    for reference in gin_precheck.references(value):
      outer, _, name = reference.rpartition("/")
      full = self._resolve(name)
      if full is not None:
        inner = scope + (tuple(outer.split("/")) if outer else ())
        self._call(full, inner, calls, macros, read)
    for macro in gin_precheck.macros(value):
      if macro in macros:
        continue
      macros.add(macro)
      if macro in self.macros:
        self._value(
          self.macros[macro].value, scope + (macro,), calls, macros, read
        )

  def unread(self) -> Iterator[gin_precheck.Binding]:
    for bindings in self.by_selector.values():
      for binding in bindings:
        if id(binding) not in self.read:
          yield binding

  def why(self, binding: gin_precheck.Binding) -> str:
    """Why `binding` is unread and what was probably meant, for its line."""
    full = self._resolve(binding.selector)
    scopes = ["/".join(s) or "none" for f, s in self.calls if f == full]
    if scopes:  # reached: only a scoped binding can then be unread
      reason = (
        f"{binding.selector} is called in no scope {binding.scope!r}, only "
        f"in: {', '.join(sorted(scopes))}"
      )
    else:
      reason = f"no binding the run reads references @{binding.selector}"
    close = suggest.closest(binding.key, self._readable(binding))
    hint = (
      " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
      if close
      else ""
    )
    return (
      f"nothing in this run reads {binding.key} ({reason}), so it changes "
      f"nothing.{hint}"
    )

  def _readable(self, binding: gin_precheck.Binding) -> list[str]:
    """The `scope/selector.param` keys the run would read (recsys's own
    configurables by their class name, TF's as registered)."""
    out = []
    for full, scope in self.calls:
      params: Sequence[str] | None
      params, _ = gin_names.CONFIGURABLES.get(full, (None, ""))
      if params is None:  # TF's and Keras's: the parameters bound to them
        params = tuple(b.param for b in self.by_selector.get(full, []))
      own = full.startswith(("recsys.", "backends."))
      selector = full.rpartition(".")[2] if own else full
      prefix = "/".join(scope) + "/" if scope else ""
      out += [f"{prefix}{selector}.{p}" for p in params or (binding.param,)]
    return out


def problems(
  files: Sequence[str], bindings: Sequence[str]
) -> list[tuple[gin_precheck.Binding, str]]:
  """`(binding, why)` of each binding nothing in the run reads, in the
  order of the files and bindings. Left out: a binding marked `# optional`;
  one made for a choice a later binding replaced (a DLRM file's model
  settings, included by a file that trains DCN-v2: `_Walk.replaced`); one
  of a name this check cannot resolve (unknown, ambiguous: refused
  elsewhere)."""
  config = gin_precheck.Config(files, bindings)
  walk = _Walk(config)
  unread = {
    id(b) for b in walk.unread() if not b.optional and not walk.replaced(b)
  }
  return [
    (binding, walk.why(binding))
    for binding in config.bindings
    if id(binding) in unread
  ]


#: What the refusal says to do.
_FIX = (
  "Remove it, end its line with '# optional' (a file that binds it for "
  "other runs on purpose), or pass --allow_unused_bindings."
)


def message(found: Sequence[tuple[gin_precheck.Binding, str]]) -> str:
  """One line naming the first unread binding, how many more there are
  and how to go on."""
  (first, why), more = found[0], found[1:]
  others = (
    f" {len(more)} more binding(s) nothing reads: "
    f"{', '.join(b.key for b, _ in more)}."
    if more
    else ""
  )
  return f"{first.where}: {why}{others} {_FIX}"


def check(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Refuses gin bindings nothing in the run reads.

  Raises:
    UnreadGinBindingError: naming the first in one line (`message`).
  """
  found = problems(files, bindings)
  if found:
    raise UnreadGinBindingError(message(found))
