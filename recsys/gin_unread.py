"""Gin bindings nothing in the run reads, named before TensorFlow starts.

Gin accepts a binding of any registered configurable and applies it only
when that configurable is called, in a scope the binding names: a
misspelt scope (`embeding_init/keras.initializers.RandomNormal.stddev`),
a parameter of a model the run does not train (`DCNv2.num_cross_layers`
in a DLRM run) or the learning rate of an optimizer it does not use
changed nothing, silently, and was absent from operative_config.gin.

This module follows the run as gin will call it, from the parsed files
and bindings (`recsys.gin_precheck.Config`), without running anything:
from `train` (and `CALLED_BY_RECSYS`), every reference of a binding it
reads (`@scope/Name` or `@scope/Name()`, called in that scope, nested in
the caller's) and every macro it uses, until nothing new is reached. A
binding of a configurable never reached, or reached only in other scopes,
is unread: named with where it is and what was probably meant. A file
that binds something on purpose for only some runs (a base file's
learning rate of an optimizer some experiments choose) says so with
`# optional` on the binding's line; `--allow_unused_bindings` lets a
command go on with a warning.

Example:
  >>> problems(["synthetic_dlrm.gin"], ["DCNv2.num_cross_layers = 7"])
  ["--gin_bindings 'DCNv2.num_cross_layers = 7': nothing in this run reads
  DCNv2.num_cross_layers (no binding the run reads references @DCNv2) ..."]
"""

from collections.abc import Iterator, Sequence

from backends import suggest
from recsys import gin_names, gin_precheck
from recsys.errors import SettingsError

#: The configurables recsys calls itself, besides through gin references,
#: so that their (unscoped) bindings apply: `train` (the CLI calls it),
#: `EmbeddingPlacement` (`planning.bound_placement`, when `train.placement`
#: is unbound), `EmbeddingSettings` (`features.feature_config`, when
#: `train.embedding` is), `UserHistory` and `ItemHistory` (MovieLens, for a
#: history feature named in `MovieLens.features` without a history).
#: tests/test_gin_unread.py reads recsys's source for other such calls.
CALLED_BY_RECSYS = (
  "recsys.run.configured.train",
  "recsys.planning.EmbeddingPlacement",
  "recsys.features.EmbeddingSettings",
  "recsys.data.user_history.UserHistory",
  "recsys.data.user_history.ItemHistory",
)

#: How deep scopes may nest before the walk stops (a reference cycle).
_MAX_SCOPES = 8


class UnreadGinBindingError(SettingsError):
  """A gin binding that no configurable of the run reads (exit status 2):
  it would change nothing."""


class _Walk:
  """Which bindings gin would apply when it runs the config."""

  def __init__(self, config: gin_precheck.Config):
    self.known = gin_precheck.known_names()
    self.macros: dict[str, gin_precheck.Binding] = {}
    # The binding gin applies of each (scope, configurable, parameter): the
    # last; one a later file or binding overrides is no mistake.
    last: dict[tuple[str, str, str], gin_precheck.Binding] = {}
    for binding in config.bindings:
      full = self._resolve(binding.selector)
      if not binding.param:
        self.macros[binding.selector] = binding
      elif full is not None:
        last[(binding.scope, full, binding.param)] = binding
    self.by_selector: dict[str, list[gin_precheck.Binding]] = {}
    for (_, full, _), binding in last.items():
      self.by_selector.setdefault(full, []).append(binding)
    self.read: set[int] = set()  # ids of the bindings read
    self.calls: set[tuple[str, tuple[str, ...]]] = set()
    self._macros_used: set[str] = set()
    for root in CALLED_BY_RECSYS:
      self._call(root, ())

  def _resolve(self, name: str) -> str | None:
    matches = self.known.get(name, [])
    return matches[0] if len(matches) == 1 else None

  def _call(self, full: str, scope: tuple[str, ...]) -> None:
    """`full` called in `scope`: its bindings of a prefix of the scope
    are read, and what their values reference is called in turn."""
    if (full, scope) in self.calls or len(scope) > _MAX_SCOPES:
      return
    self.calls.add((full, scope))
    for binding in self.by_selector.get(full, []):
      parts = tuple(binding.scope.split("/")) if binding.scope else ()
      if scope[: len(parts)] == parts:
        self.read.add(id(binding))
        self._value(binding.value, scope)

  def _value(self, value: object, scope: tuple[str, ...]) -> None:
    for reference in gin_precheck.references(value):
      outer, _, name = reference.rpartition("/")
      full = self._resolve(name)
      if full is not None:
        self._call(full, scope + (tuple(outer.split("/")) if outer else ()))
    for macro in gin_precheck.macros(value):
      if macro in self._macros_used:
        continue
      self._macros_used.add(macro)
      if macro in self.macros:
        self._value(self.macros[macro].value, scope + (macro,))

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
  order of the files and bindings; a binding marked `# optional` and one
  of a name this check cannot resolve (unknown, ambiguous: refused
  elsewhere) are left out."""
  config = gin_precheck.Config(files, bindings)
  walk = _Walk(config)
  unread = {id(b) for b in walk.unread() if not b.optional}
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
