"""The RocksDB store, the only code that knows a column family's name or key layout:
``keys`` (the column families and how their keys are built), ``database`` (``Store``,
``Batch``), ``tables`` (the families by what they hold: ``docs.get(store, ordinal)``),
``lists`` (the passage index's inverted lists), ``records`` (notes, logs, offsets and
checkpoints by name), ``forward_reader`` (what the align stage reads), ``options``
(RocksDB options), ``failures`` (errors in an operator's words)."""
