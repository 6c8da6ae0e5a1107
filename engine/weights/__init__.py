"""Where weights come from: safetensors checkpoints (local or Hub), GGUF files converted
once to that layout, the packaged default model, and random (dummy) weights."""

from engine.weights.errors import CheckpointError

__all__ = ["CheckpointError"]
