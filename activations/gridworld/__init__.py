"""goalprobe: activations/gridworld."""
