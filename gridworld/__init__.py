"""goalprobe: gridworld."""
