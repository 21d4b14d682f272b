"""Keras-facing embedding layers that delegate to an embedding backend.

`Embedding` is the drop-in for `tfrs.layers.embedding.TPUEmbedding`: change
the import and `fit` trains the tables on any hardware.
"""

from recsys.layers.embedding import (
  Embedding,
  EmbeddingCalledTwiceError,
  embedding_optimizer,
)

__all__ = ["Embedding", "EmbeddingCalledTwiceError", "embedding_optimizer"]
