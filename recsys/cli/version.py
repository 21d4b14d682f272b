"""`recsys --version` and the version line `recsys info` starts with."""

import argparse
import platform


def _installed_version(*packages: str) -> str:
  """The version of the first of `packages` installed ("?": none)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  for package in packages:
    try:
      return metadata.version(package)
    except metadata.PackageNotFoundError:
      continue
  return "?"


def version_line(
  tensorflow: str | None = None, keras_module: str = "tf_keras"
) -> str:
  """recsys, TensorFlow, Keras and Python versions, in one line.

  Args:
    tensorflow: TF's version as imported (None: the installed package's,
      read without importing TensorFlow, for `recsys --version`).
    keras_module: the module `tf.keras` is (recsys makes it tf_keras).
  """
  import recsys  # pylint: disable=g-import-not-at-top

  tensorflow = tensorflow or _installed_version(
    "tensorflow", "tensorflow-cpu", "tf-nightly"
  )
  return (
    f"recsys {recsys.__version__}, TensorFlow {tensorflow}, "
    f"Keras {_installed_version('tf-keras')} ({keras_module}), "
    f"Python {platform.python_version()}"
  )


class PrintVersion(argparse.Action):
  """`recsys --version`: prints `version_line()` (TF is not imported)."""

  def __init__(self, option_strings, dest, **kwargs):
    super().__init__(option_strings, dest, nargs=0, **kwargs)

  def __call__(self, parser, namespace, values, option_string=None):
    print(version_line())
    parser.exit()
