"""publishing."""
