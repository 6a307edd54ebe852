"""goalprobe: activations/capture."""
