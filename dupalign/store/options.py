"""RocksDB options of the store's families and of the table files written aside for them."""

from __future__ import annotations

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    MemtableFactory,
    Options,
    ReadOptions,
    SliceTransform,
)

from dupalign.store.keys import PREFIX_LENGTHS

# Their memtables are hash tables of small skip lists, one per prefix: a page adds ~1,600
# list entries in one batch, and inserting them into one big skip list cost ~3 µs each
# (most of the index stage's store write on llvm); a bucket's list is short. Such a
# memtable answers a seek within one prefix only, so reads that cross prefixes ask for
# total order (``total_order``) and RocksDB merges the buckets for them.
MEMTABLE_BUCKETS = 1 << 20

BLOCK_CACHE_BYTES = 256 << 20  # uncompressed blocks shared by all families (default)
WAL_BYTES = 128 << 20  # write-ahead log kept at most (about): see family_options


def family_options(family: str | None = None, cache: Cache | None = None,
                   memtable_bytes: int = 0) -> Options:
    """``memtable_bytes``: the budget every family's memtables share (0: none); see
    ``Store``."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if cache is not None:
        # list reads are random over the whole store, so a small per-family cache holds
        # little of it (tests/bench/bench_store.py compares reads with plain options)
        table.set_block_cache(cache)
        # A table's index and filter blocks live in the cache, so its budget bounds them:
        # held outside it they grew with the store (~0.2 MB per 1,000 pages). Level 0's
        # stay pinned. (Partitioned index and filters read lists 1.6-2x slower in
        # tests/bench/bench_store.py; see docs/performance/memory.md.)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    opts.increase_parallelism(2)
    # A write-ahead log file is deleted only when every family with data in it has been
    # flushed; small families (ids, offsets, meta) seldom fill a memtable, so without a
    # bound the logs pile up (tests/bench/bench_lifecycle.py saw 650 MB of them under a
    # 150 MB store): past this size RocksDB flushes the families that hold the oldest.
    opts.set_max_total_wal_size(WAL_BYTES)
    # (one writer thread: concurrent memtable inserts gain nothing, and the hash memtables
    # below do not support them)
    opts.set_allow_concurrent_memtable_write(False)
    if family in PREFIX_LENGTHS:
        opts.set_prefix_extractor(SliceTransform.create_fixed_prefix(PREFIX_LENGTHS[family]))
        # (bucket count, skip list height, branching factor; rocksdict's stub omits them)
        opts.set_memtable_factory(MemtableFactory.hash_skip_list(  # type: ignore[call-arg]
            MEMTABLE_BUCKETS, 4, 4))
    if memtable_bytes:
        # RocksDB stops a family's writes while it has this many memtables (one being
        # flushed, one filling), so a family holds a quarter of the budget at most, however
        # fast the writer: a hard bound for four busy families, and the budget's flush
        # trigger keeps more of them near it. The hash memtable's bucket array is in its size
        room = memtable_bytes // 8
        if family in PREFIX_LENGTHS:
            room += MEMTABLE_BUCKETS * 8
        opts.set_write_buffer_size(min(room, 64 << 20))
        opts.set_max_write_buffer_number(2)
    return opts


def table_file_options(family: str) -> Options:
    """Options for table files written aside for ``family`` (``Store.ingest``)."""
    return family_options(family)


def total_order() -> ReadOptions:
    """Read options of a scan that may cross prefixes (see ``MEMTABLE_BUCKETS``)."""
    ropts = ReadOptions()
    ropts.set_total_order_seek(True)
    return ropts
