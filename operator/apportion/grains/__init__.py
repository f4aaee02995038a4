"""grains."""
