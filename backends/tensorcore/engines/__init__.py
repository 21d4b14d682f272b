"""How a step computes: the lookup engines of the backends that own tables.

  dynamic.DynamicEngine  flat bags of any size (`backends.inputs`), one
                         `tf.unique` per table; on CPU hosts outside XLA the
                         fused C++ kernels of `backends.tensorcore.kernels`
                         ("fused"), else TF ops ("tf_ops").
  static.StaticEngine    every shape fixed at trace time
                         (`backends.static_bags`): what XLA and TPUs compile.

Both run against any storage (`backends.storage`) and leave the same
`backends.table_step.TableStep` per table; the same math, up to the order
of float sums.
"""

from backends.tensorcore.engines.base import Engine

__all__ = ["Engine"]
