"""The RocksDB store, the only code that knows the key layout: ``keys`` (the column families
and how their keys are built), ``database`` (``Store``, ``Batch``), ``records`` (the records
by name), ``options`` (RocksDB options), ``failures`` (errors in an operator's words),
``forward_copy`` (the align role's copy of forward records)."""
