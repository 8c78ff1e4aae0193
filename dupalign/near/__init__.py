"""Whole-document near duplicates: simhash, VOSH, PSM, BPHS, CWS, idf, the index."""
