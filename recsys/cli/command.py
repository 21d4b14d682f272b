"""What a `recsys` command declares once: its name, its help texts, its
flags and whether it needs TensorFlow started.

Each command module holds one `Command` as `COMMAND` (and `run(args) -> int`);
`recsys/cli/__init__.py` builds every subcommand's parser from these records,
so the parser's shape is written in one place.
"""

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Command:
  """One subcommand of `recsys`.

  Attributes:
    name: the subcommand, e.g. "train".
    help: its line in `recsys --help`.
    description: what `recsys NAME --help` says first (line breaks kept).
    add_flags: adds the command's flags to its parser.
    starts_tensorflow: whether `recsys.process.startup` starts TensorFlow
      before the command runs.
    epilog: its examples, after the flags (line breaks kept).
  """

  name: str
  help: str
  description: str
  add_flags: Callable[[argparse.ArgumentParser], None]
  starts_tensorflow: bool
  epilog: str | None = None

  def add_parser(self, subparsers: Any) -> argparse.ArgumentParser:
    """The command's parser, with its flags, added to `subparsers`."""
    parser = subparsers.add_parser(
      self.name,
      help=self.help,
      description=self.description,
      epilog=self.epilog,
      formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    self.add_flags(parser)
    return parser
