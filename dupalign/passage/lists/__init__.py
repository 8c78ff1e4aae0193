"""The passage index's inverted lists in memory and on disk."""
