"""The RocksDB store: column families, key layout, formats."""
