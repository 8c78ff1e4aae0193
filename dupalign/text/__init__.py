"""Bytes → text → normalized word tokens with offsets; seeded hashing."""
