"""The sharded backend (tables row-sharded over parameter servers): a placeholder.

Registered so that selection under a `ParameterServerStrategy` names it and
explains itself; it is not implemented yet and reports itself unavailable
everywhere, so `backends.create` refuses it with that reason.
"""

from typing import Any, Dict, Optional

import tensorflow as tf

from backends import base

NOT_IMPLEMENTED = "not implemented yet: see the scale-out issue"


class ShardedEmbedding(base.EmbeddingBackend):
  """Tables row-sharded over parameter servers (not implemented yet)."""

  name = "sharded"
  capabilities = base.Capabilities(sharded_tables=True)

  @classmethod
  def unavailable_reason(cls, strategy: tf.distribute.Strategy) -> Optional[str]:
    del strategy
    return NOT_IMPLEMENTED

  def build(self) -> None:
    raise NotImplementedError(NOT_IMPLEMENTED)

  @property
  def embedding_tables(self) -> Dict[Any, tf.Variable]:
    raise NotImplementedError(NOT_IMPLEMENTED)

  def lookup(self, features: Any, weights: Optional[Any] = None,
             training: bool = False) -> Any:
    raise NotImplementedError(NOT_IMPLEMENTED)
