"""Engine parameters: defaults, validation, and the subset that must match the store.

Parameters that change what is written to the store (seeds, k, K, bit layout, tokenization)
are "frozen": they are recorded in the store's ``meta`` family at creation and a store
refuses to open with different ones. The rest (thresholds, budgets, limits) may change
between runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from fractions import Fraction
from typing import Any, TypedDict

from dupalign.errors import ConfigError

NEAR_TF_MODES = ("raw", "log", "binary", "sqrt")
PASSAGE_TF_MODES = ("raw", "log", "binary", "sqrt", "squared")


def _check_range(key: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi):
        raise ConfigError(key, f"{value!r} is out of range [{lo}, {hi}]")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"{value!r} is not one of {', '.join(choices)}")


def parse_fraction(key: str, value: Any) -> Fraction:
    """θ as an exact fraction: "2/5", "0.4" or 0.4 all give 2/5."""
    try:
        frac = Fraction(str(value)).limit_denominator(1000)
    except (ValueError, ZeroDivisionError) as exc:
        raise ConfigError(key, f"{value!r} is not a number or fraction like 2/5") from exc
    if not (0 < frac <= 1):
        raise ConfigError(key, f"{value!r} must be in (0, 1]")
    return frac


@dataclass(frozen=True)
class TextConfig:
    # HTML: main content only (resiliparse boilerplate removal: navigation, headers, footers).
    # Site chrome repeated on every page would otherwise match as "copied passages" everywhere.
    main_content: bool = True
    max_page_bytes: int = 16 * 1024 * 1024
    max_tokens: int = 2_000_000

    def validate(self) -> None:
        _check_range("text.max_page_bytes", self.max_page_bytes, 1024, 1 << 30)
        _check_range("text.max_tokens", self.max_tokens, 100, 100_000_000)


@dataclass(frozen=True)
class NearConfig:
    enabled: bool = True
    # 5 and 0.85 (3-shingles): on llvm-13/14 and Boost, h = 3 missed 3.5 % of the pairs of
    # 5-shingle Jaccard >= 0.85 (their fingerprints 4-5 bits apart) and 0.8 let in pairs of
    # 3-shingle Jaccard 0.8-0.85 below it (docs/performance/near.md, "Defaults")
    hamming: int = 5
    probe_budget: int = 64  # VOSH probes per lookup
    mode: str = "all"  # PSM_A ("all") or PSM_F ("first")
    min_tokens: int = 10  # shorter pages get exact matching only
    cws_samples: int = 128
    cws_threshold: float = 0.85  # word-shingle Jaccard a near duplicate must reach
    # words per verification shingle: 3 is standard w-shingling; on llvm-13/14 it rejects the
    # templated pages that share words in another order (dupalign.near.index)
    shingle: int = 3
    cws_error: float = 1e-3  # e: probability budget of each early-termination bound
    tf_mode: str = "log"
    idf_freeze_at: tuple[int, ...] = (1000, 10000, 100000)

    def validate(self) -> None:
        _check_range("near.hamming", self.hamming, 0, 7)
        _check_range("near.probe_budget", self.probe_budget, 1, 1_000_000)
        _check_choice("near.mode", self.mode, ("all", "first"))
        _check_range("near.min_tokens", self.min_tokens, 1, 1_000_000)
        _check_range("near.cws_samples", self.cws_samples, 8, 4096)
        _check_range("near.cws_threshold", self.cws_threshold, 0.01, 1.0)
        _check_range("near.shingle", self.shingle, 1, 16)
        _check_range("near.cws_error", self.cws_error, 1e-12, 0.5)
        _check_choice("near.tf_mode", self.tf_mode, NEAR_TF_MODES)
        if list(self.idf_freeze_at) != sorted(set(self.idf_freeze_at)) or any(
            n < 1 for n in self.idf_freeze_at
        ):
            raise ConfigError("near.idf_freeze_at", "must be increasing positive doc counts")


PASSAGE_MODES = ("oph", "weighted", "weighted_oph")


@dataclass(frozen=True)
class PassageConfig:
    enabled: bool = True
    # "oph" (Jaccard), "weighted" (MonoActive, weighted Jaccard) or "weighted_oph" (weighted
    # Jaccard near OPH's cost: OPH over weights cut into elements; dupalign.passage.weighted_oph)
    mode: str = "oph"
    k: int = 64
    theta: str = "3/10"
    # Alignment units: w-word shingles. Words (1) make stop-word inverted lists that grow with
    # the corpus; 2 keeps lists short and, on Clough, the same cut/light recall at θ = 0.3.
    shingle: int = 2
    query_len: int = 48  # units per query passage
    stride: int = 24
    min_len: int = 24  # shortest aligned subsequence reported, in units
    # earlier pages aligned per query passage (most collided bins first, ties to the earliest)
    max_candidates: int = 16
    # passage matches (earlier pages) reported per page: popular text copied everywhere
    # would otherwise make a page's work and output grow with the crawl; the best are kept,
    # ranked from the scan's hits before any span is computed (dupalign.stages.align.rank_pages:
    # most units of the page covered by the passages that hit the page, then the highest
    # estimate, then the earliest page)
    max_matches: int = 16
    # Candidate pages are counted from the first this-many entries (the earliest pages) of
    # each inverted list only: the index's counting work per passage stays bounded however
    # often text was copied (lists grow with the copies up to max_list), and the earliest
    # copies (the originals) are the ones kept. A function of the lists alone, so it does not
    # depend on the list cache or --jobs. Not frozen. max_list or more: no cut.
    max_list_read: int = 64
    # Inverted lists longer than this are stop lists: they hold common units (boilerplate,
    # stock phrases), and a passage's bin whose list is one counts as neither a collision
    # nor an empty bin (dupalign.passage.index). Frozen: results depend on it.
    max_list: int = 256
    # Text repeated inside an earlier page (tables, logs, a block pasted many times) puts
    # a passage's min-hashes at every repeat, and aligning the passage to all of them made
    # a page's cost grow with the square of its length (tests/bench/bench_repeats.py). A
    # list holding more than this many windows of one earlier page gives the passage its
    # first this-many, and those where the passage's rarer units (lists with fewer) place
    # it in that page (dupalign.passage.batch_align._gather_matched): a block repeated more often
    # is found at its first places, other text as before. Not frozen (align reads it).
    max_repeats: int = 8
    tf_mode: str = "log"  # weighted and weighted_oph modes only
    # Report the tight alignment inside the scan's padded detections (dupalign.passage.span_refine);
    # false: the scan's merged spans. Reporting only: matched pages are the same either way.
    refine: bool = True

    def validate(self) -> None:
        _check_choice("passage.mode", self.mode, PASSAGE_MODES)
        _check_range("passage.k", self.k, 4, 1024)
        parse_fraction("passage.theta", self.theta)
        _check_range("passage.shingle", self.shingle, 1, 8)
        _check_range("passage.query_len", self.query_len, 4, 100_000)
        _check_range("passage.stride", self.stride, 1, self.query_len)
        _check_range("passage.min_len", self.min_len, 1, 100_000)
        _check_range("passage.max_candidates", self.max_candidates, 1, 100_000)
        _check_range("passage.max_matches", self.max_matches, 1, 100_000)
        _check_range("passage.max_list", self.max_list, 1, 100_000_000)
        _check_range("passage.max_list_read", self.max_list_read, 1, 100_000_000)
        _check_range("passage.max_repeats", self.max_repeats, 1, 100_000_000)
        _check_choice("passage.tf_mode", self.tf_mode, PASSAGE_TF_MODES)

    @property
    def theta_fraction(self) -> Fraction:
        return parse_fraction("passage.theta", self.theta)


# What a worker holds besides its caches (interpreter, numba kernels, RocksDB's own, what
# the allocator keeps of freed memtables): the engine in-process was at 292 MB RSS after
# 1,000 pages, 102 MB of it caches, and at 20,000 pages 140 MB above its measured parts
# (docs/performance/memory.md); ``memory_mb`` gives the caches what is left above this.
BASE_MB = 384
# Shares of ``memory_mb - BASE_MB`` among the caches a key leaves at 0: the inverted lists
# save the most reads per byte (docs/performance/passages.md); ``forward`` is each of
# the engine's two record caches (index stage and in-process align).
MEMORY_SHARES = {"lists": 0.55, "blocks": 0.2, "memtables": 0.15, "forward": 0.05}
DEFAULT_MB = {"lists": 1024, "blocks": 256, "forward": 64}  # without memory_mb


class StoreBudgets(TypedDict):
    """The store's share of the budgets, in the bytes ``Store`` takes."""

    block_cache_bytes: int
    memtable_bytes: int  # every family's memtables together (0: unbounded)


@dataclass(frozen=True)
class CacheConfig:
    """Memory budgets (runtime only: they change speed, never results). A per-cache key
    at 0 takes its default, or with ``memory_mb`` its share of it (``budgets_mb``)."""

    # one bound for the worker's memory: its caches and every family's memtables share
    # what BASE_MB leaves; 0: no bound on the memtables, each cache its own default
    memory_mb: int = 0
    # inverted lists of the passage index kept in memory: 1 GB holds the lists a stream of
    # 10^5 pages keeps asking for; with 256 MB, reads from the store doubled the cost per
    # page by then (docs/performance/passages.md, "Cost as the store grows")
    lists_mb: int = 0
    blocks_mb: int = 0  # RocksDB block cache shared by all column families
    # candidate pages' forward records kept by each align worker (dupalign.passage.forward
    # RecordCache): on llvm-13/14, 4,059 reads were of 313 pages (39 MB)
    forward_mb: int = 0

    def validate(self) -> None:
        _check_range("cache.memory_mb", self.memory_mb, 0, 1 << 20)
        _check_range("cache.lists_mb", self.lists_mb, 0, 1 << 20)
        _check_range("cache.blocks_mb", self.blocks_mb, 0, 1 << 20)
        _check_range("cache.forward_mb", self.forward_mb, 0, 1 << 20)
        if self.memory_mb:
            b = self.budgets_mb()
            if min(b.values()) < 1:
                given = {k: v for k, v in self.explicit_mb().items() if v}
                raise ConfigError("cache.memory_mb", (
                    f"{self.memory_mb} leaves no room for every cache: {BASE_MB} MB go to the "
                    f"process itself, {given or 'no cache sizes'} given; try at least "
                    f"{BASE_MB + 21 + sum(given.values())}"))

    def explicit_mb(self) -> dict[str, int]:
        return {"lists": self.lists_mb, "blocks": self.blocks_mb, "forward": self.forward_mb}

    def budgets_mb(self) -> dict[str, int]:
        """MB of each cache (lists, blocks, forward: each of the engine's two) and of all
        memtables (0: unbounded). Keys given explicitly are honoured; with ``memory_mb``
        the others share what they and BASE_MB leave, in MEMORY_SHARES' proportions."""
        given = self.explicit_mb()
        if not self.memory_mb:
            return {k: v or DEFAULT_MB[k] for k, v in given.items()} | {"memtables": 0}
        weight = {"forward": 2} | {k: 1 for k in ("lists", "blocks", "memtables")}
        left = self.memory_mb - BASE_MB - sum(weight[k] * v for k, v in given.items())
        auto = [k for k in MEMORY_SHARES if not given.get(k)]
        total = sum(weight[k] * MEMORY_SHARES[k] for k in auto)
        return {k: given.get(k) or int(left * MEMORY_SHARES[k] / total) for k in MEMORY_SHARES}

    def store_bytes(self) -> StoreBudgets:
        b = self.budgets_mb()
        return {"block_cache_bytes": b["blocks"] << 20, "memtable_bytes": b["memtables"] << 20}


# Frozen parameters added after stores were made, with the value those stores were built
# with: a store that did not record one was built with this value.
# (Stores before format 5 did not freeze max_list; 256 was the default.)
IMPLIED_PARAMS = {"near_shingle": 3, "passage_max_list": 256}
# Older values of frozen parameters that a store can be upgraded from in place: format 6
# (its replay values only lack the reading, and answer any) and 7 (every list entry is in
# the lists). Older formats are refused with a message saying how to rebuild them (format
# 6 moved every window out of the inverted lists into forward records).
PARAM_UPGRADES: dict[str, tuple[Any, ...]] = {"format": (6, 7)}


@dataclass(frozen=True)
class RetentionConfig:
    """How much history the store keeps (runtime only: removal is exact, so these decide
    which pages are alive, never how the alive ones match). 0 turns a bound off. Applied
    by ``Engine.compact`` (``dupalign compact``, and the worker every ``every`` seconds)."""

    max_age: int = 0  # seconds: pages whose version was fetched (fetched_at) earlier leave
    max_pages: int = 0  # at most this many pages stay: the oldest (lowest ordinals) leave
    every: int = 300  # seconds between the worker's retention sweeps

    def validate(self) -> None:
        _check_range("retention.max_age", self.max_age, 0, 1 << 40)
        _check_range("retention.max_pages", self.max_pages, 0, 1 << 40)
        _check_range("retention.every", self.every, 1, 1 << 30)


# the sample rate of the recall audit where ``audit.sample`` is left at -1: the worker audits,
# ``scan`` and the API do not (measured cost: docs/performance/audit.md)
WORKER_AUDIT_SAMPLE = 0.0005


@dataclass(frozen=True)
class AuditConfig:
    """The recall audit (dupalign.audit; runtime only: it never changes a match)."""

    # share of pages audited; -1: the command's default (worker WORKER_AUDIT_SAMPLE, scan 0)
    sample: float = -1.0
    # stored pages (all their windows) the audited pages' passages are aligned against
    reservoir: int = 256

    def validate(self) -> None:
        if self.sample != -1.0:
            _check_range("audit.sample", self.sample, 0.0, 1.0)
        _check_range("audit.reservoir", self.reservoir, 1, 1_000_000)

    def rate(self, default: float) -> float:
        return default if self.sample < 0 else self.sample


@dataclass(frozen=True)
class EngineConfig:
    seed: int = 0x5EED
    text: TextConfig = field(default_factory=TextConfig)
    near: NearConfig = field(default_factory=NearConfig)
    passage: PassageConfig = field(default_factory=PassageConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def validate(self) -> EngineConfig:
        _check_range("seed", self.seed, 0, (1 << 32) - 1)
        self.text.validate()
        self.near.validate()
        self.passage.validate()
        self.cache.validate()
        self.retention.validate()
        self.audit.validate()
        return self

    def frozen_params(self) -> dict[str, Any]:
        """What the store's contents depend on; recorded in ``meta`` and checked at open."""
        out: dict[str, Any] = {"format": STORE_FORMAT}
        for name, (section, key) in FROZEN_FIELDS.items():
            value = getattr(self if section is None else getattr(self, section), key)
            out[name] = list(value) if isinstance(value, tuple) else value
        if self.passage.mode == "weighted_oph":
            out["passage_woph"] = WOPH_VERSION
        return out

    def with_frozen(self, params: dict[str, Any]) -> EngineConfig:
        """This configuration with the frozen parameters a store recorded (what a reader of
        the store must use: its lists, sketches and stop lists were made with them)."""
        sections: dict[str, Any] = {}
        top: dict[str, Any] = {}
        for name, (section, key) in FROZEN_FIELDS.items():
            if name not in params:
                continue
            value = params[name]
            if isinstance(getattr(self if section is None else getattr(self, section), key),
                          tuple):
                value = tuple(value)  # recorded as a list
            if section is None:
                top[key] = value
            else:
                sections.setdefault(section, {})[key] = value
        return replace(self, **top, **{
            sec: replace(getattr(self, sec), **kw) for sec, kw in sections.items()}).validate()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        """Build from a TOML-like mapping; unknown keys and bad values raise ConfigError."""
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(key, "must be a table")
                kwargs[key] = _build_section(key, SECTIONS[key], value)
            elif key == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ConfigError("seed", f"{value!r} is not an integer")
                kwargs[key] = value
            else:
                raise ConfigError(key, "unknown key")
        return cls(**kwargs).validate()


# 2: near verification sketches are 3-shingle min-hashes (1: ICWS);
# 3: long inverted lists carry a marker (format 2 readers cannot parse it)
# 4: inverted lists may start with a packed run (format 3 readers cannot parse it)
# 5: lists longer than max_list are stop lists; no list fingerprints of pages
# 6: inverted lists of page ordinals (varint-delta runs) and per-page forward records of
#    windows (family ``forward``), no ``oph_empty``; the forward record names every list
#    that holds the page and its docs record keeps its replay key, so that a page can be
#    removed (revisits, deletes, retention)
# 7: a replay value is the ordinal and how the page was read (dupalign.text.tokens.reading): a
#    format 6 reader would take such a page for removed and index it again; forward
#    records of pages under 65,536 units have <u2 positions (dupalign.passage.forward), and
#    positions records keep <u2 steps between offsets when they fit (dupalign.passage.index)
# 8: the inverted lists may lack the entries of the pages from the meta key lists_through
#    on (written behind the index thread, dupalign.passage.lists.files): read back from their
#    forward
#    records at open, which a format 7 reader would not do
STORE_FORMAT = 8
# the windows of passage.mode = "weighted_oph", recorded by its stores only: 2, a bin's
# empty windows are the steps where the text has no element in it (dupalign.passage.
# weighted_oph); the stores of 1 (gaps between positions, not recorded) are read, not
# written to, since their pages' windows would disagree with the new ones'
WOPH_VERSION = 2
# frozen parameter (as recorded in the store) -> (config section or None, field)
FROZEN_FIELDS: dict[str, tuple[str | None, str]] = {
    "seed": (None, "seed"),
    "main_content": ("text", "main_content"),
    "tf_mode": ("near", "tf_mode"),
    "cws_samples": ("near", "cws_samples"),
    "near_shingle": ("near", "shingle"),
    "idf_freeze_at": ("near", "idf_freeze_at"),
    "passage_mode": ("passage", "mode"),
    "passage_k": ("passage", "k"),
    "passage_shingle": ("passage", "shingle"),
    "passage_tf_mode": ("passage", "tf_mode"),
    "passage_max_list": ("passage", "max_list"),
}

# the tables of an engine configuration (a TOML file's [engine.<name>])
SECTIONS: dict[str, type] = {"text": TextConfig, "near": NearConfig, "passage": PassageConfig,
                             "cache": CacheConfig, "retention": RetentionConfig,
                             "audit": AuditConfig}


def _build_section(name: str, cls: type, data: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"{name}.{key}", "unknown key")
        default = getattr(defaults, key)
        if isinstance(default, tuple):
            if not isinstance(value, list | tuple):
                raise ConfigError(f"{name}.{key}", f"{value!r} is not a list")
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{name}.{key}", f"{value!r} is not true/false")
        elif isinstance(default, int):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{name}.{key}", f"{value!r} is not an integer")
        elif isinstance(default, float):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ConfigError(f"{name}.{key}", f"{value!r} is not a number")
            value = float(value)
        elif isinstance(default, str) and not isinstance(value, str | int | float):
            raise ConfigError(f"{name}.{key}", f"{value!r} is not a string")
        kwargs[key] = str(value) if isinstance(default, str) else value
    return cls(**kwargs)
