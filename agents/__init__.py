"""goalprobe: agents."""
