"""goalprobe: probes/scoring."""
