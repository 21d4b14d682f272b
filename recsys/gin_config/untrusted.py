"""Reads back a model dir's gin config without letting it run code.

`recsys evaluate` and `recsys export` rebuild a run from
`<model_dir>/operative_config.gin`. Gin files are code: an `import` line
imports (runs) a module — from the working directory too — and `include`
pulls in another file that may. A model dir is data that may come from
elsewhere, and re-creating a run needs only the project's registered
configurables, so a config read back from a model dir may hold bindings
only. Gin files given with `--gin_file` are the user's own, trusted input.
"""

from collections.abc import Iterator

import gin  # gin.config_parser needs gin's package set up
from gin import config_parser

from recsys.errors import RecsysError


class UntrustedConfigError(RecsysError, ValueError):
  """A config read back from a model dir holds statements that run code."""


def _statements(path: str) -> Iterator[object]:
  with open(path, encoding="utf-8") as f:
    parser = config_parser.ConfigParser(
      f, gin.config.ParserDelegate(skip_unknown=True)
    )
    try:
      yield from parser  # one statement at a time, in file order
    except SyntaxError:
      return  # gin's parse reports it, with the line (nothing ran before it)


def check_bindings_only(path: str) -> str:
  """Returns `path` if its gin statements are all bindings.

  Raises:
    UntrustedConfigError: an `import` or `include` line, named with its
      file and line.
  """
  for statement in _statements(path):
    if isinstance(
      statement, (config_parser.ImportStatement, config_parser.IncludeStatement)
    ):
      where = statement.location
      line = (where.line_content or "").strip()
      raise UntrustedConfigError(
        f"{path}:{where.line_num}: {line!r}: a config read back from a "
        "model dir may hold only bindings; 'import' and 'include' run or "
        "pull in code, and a model dir is not trusted input. If you trust "
        "this run, pass its gin files with --gin_file (gin files are "
        "code: use only ones you trust)."
      )
  return path
