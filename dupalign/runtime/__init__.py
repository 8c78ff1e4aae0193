"""Running the stages: one page at a time (engine), or on all cores (pipeline, pool)."""
