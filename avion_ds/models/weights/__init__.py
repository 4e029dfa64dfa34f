"""Weights from files: one filter per checkpoint format, the safe (weights-only) loader, loading into
partitioned models and streaming safetensors."""
