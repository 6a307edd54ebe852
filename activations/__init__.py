"""goalprobe: activations."""
