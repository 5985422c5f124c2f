"""What runs: model configs (presets and config.json) and their shards, every operator's
shapes and costs (the one definition the profilers also use), and the sweep grid."""

from perfmodel.models.config import ModelConfig, load_model

__all__ = ["ModelConfig", "load_model"]
