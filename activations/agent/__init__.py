"""goalprobe: activations/agent."""
