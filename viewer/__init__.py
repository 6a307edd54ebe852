"""goalprobe: viewer."""
