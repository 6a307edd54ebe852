"""goalprobe: goalprobe."""
