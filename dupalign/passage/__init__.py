"""Copied passages: compact windows (OPH, MonoActive), the interval scan and its batched
kernels, span refinement, forward records, the passage index."""
