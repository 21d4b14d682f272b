"""Training: compiled step loops, the controller, the Trainer, and `train`
(a gin-configured run trained, evaluated, restored or built)."""

from recsys.run import schedules
from recsys.run.strategy import StrategyError, make_strategy
from recsys.training.train import train
from recsys.training.trainer import (
  EmptyEvalSetError,
  Trainer,
  TrainerConfigError,
)

__all__ = [
  "EmptyEvalSetError",
  "StrategyError",
  "Trainer",
  "TrainerConfigError",
  "make_strategy",
  "schedules",
  "train",
]
