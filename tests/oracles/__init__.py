"""Brute-force twins of the engine's algorithms, easy to trust, for property tests."""
