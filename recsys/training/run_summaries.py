"""TensorBoard records of a run's settings: the operative config and HParams.

So runs compare side by side: the operative config is written as a text
summary (rendered as a code block by TensorBoard's text plugin), and, when
the `tensorboard` package is installed, the gin bindings with plain values
(numbers, strings, booleans) go to the HParams plugin.

Example:
  >>> with writer.as_default(step=0):
  ...   write_config_summaries(gin.operative_config_str(), step=0)
"""

import ast
import logging

from tensorflow.core.framework import summary_pb2  # pylint: disable=g-direct-tensorflow-import

from recsys._keras import tf
from recsys.training import run_configs

log = logging.getLogger("recsys.training")

CONFIG_TAG = "operative_config"

HParam = int | float | str | bool


def hparams(config_text: str) -> dict[str, HParam]:
  """The bindings of an operative config whose values are plain scalars."""
  out = {}
  for key, text in run_configs.bindings(config_text).items():
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      continue  # references (@Class), macros, objects
    if isinstance(value, (bool, int, float, str)):
      out[key] = value
  return out


def write_config_summaries(config_text: str, step: int) -> None:
  """Writes the config as text (and HParams) into the default summary writer."""
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = "text"
  markdown = "\n".join("    " + line for line in config_text.splitlines())
  tf.summary.write(
    CONFIG_TAG,
    tf.constant(markdown),
    step=step,
    metadata=metadata.SerializeToString(),
  )
  try:
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  except ImportError:
    log.info(
      "HParams not written: the tensorboard package is not installed "
      "(pip install tensorboard); the config is in the text summary."
    )
    return
  values = hparams(config_text)
  if values:
    hp.hparams(values)
