"""The recall audit: for a sample of pages, the exact answer (exhaustive Hamming search,
alignment without caps or stop lists) beside what the index returned, and recall estimates
with intervals. ``exact`` (the exact answers), ``reservoir`` (the stored pages passages are
checked against), ``recall`` (tallies and intervals), ``auditor`` (capture and run)."""
