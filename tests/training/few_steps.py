"""`Trainer` keywords for the small, quiet runs the trainer tests build, so
each test names only the settings it is about."""

SMALL = dict(
  global_batch_size=10, train_steps=2, steps_per_loop=1, eval_steps=1
)


def quiet(**settings):
  """`settings` with no progress bar and no TensorBoard summaries."""
  return dict(settings, progress_bar=False, summaries=False)


def few_steps(**settings):
  """Quiet keywords of a run of SMALL's sizes; `settings` replace or add."""
  return quiet(**{**SMALL, **settings})
