"""Training: compiled step loops, the controller, the Trainer, and `train`
(a gin-configured run trained, evaluated, restored or built)."""

from recsys.data.errors import EmptyEvalSetError
from recsys.run import schedules
from recsys.run.strategy import StrategyError, make_strategy
from recsys.train_settings import TrainerConfigError
from recsys.training.train import train
from recsys.training.trainer import Trainer

__all__ = [
  "EmptyEvalSetError",
  "StrategyError",
  "Trainer",
  "TrainerConfigError",
  "make_strategy",
  "schedules",
  "train",
]
