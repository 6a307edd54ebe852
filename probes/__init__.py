"""goalprobe: probes."""
