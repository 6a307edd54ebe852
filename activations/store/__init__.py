"""goalprobe: activations/store."""
