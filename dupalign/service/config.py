"""Worker configuration: one TOML file, then ``DUPALIGN_<TABLE>_<KEY>`` environment overrides,
then command-line flags. Every value is checked at start-up; a bad one raises ConfigError
naming the key and what is allowed.

Tables: ``[kafka]`` (topics, group, client tuning, SASL/SSL pass-through), ``[worker]``
(batching, back-pressure, limits), ``[metrics]`` (HTTP endpoint) and ``[engine]`` (handed to
``dupalign.config.EngineConfig.from_dict``). Environment examples::

    DUPALIGN_KAFKA_BOOTSTRAP_SERVERS=broker:9092
    DUPALIGN_KAFKA_SASL_PLAIN_PASSWORD=...          # strings stay strings
    DUPALIGN_KAFKA_SASL_PASSWORD_FILE=/run/secrets/kafka/password   # or from a file
    DUPALIGN_WORKER_BATCH_SIZE=128                  # parsed as a TOML value
    DUPALIGN_ENGINE_NEAR_HAMMING=4                  # [engine.near] hamming
"""

from __future__ import annotations

import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dupalign.config import SECTIONS, EngineConfig
from dupalign.errors import ConfigError
from dupalign.service.kafka_args import REMOVED_TOPOLOGY
from dupalign.wire.messages import DEAD_LETTER_OVERHEAD

ENV_PREFIX = "DUPALIGN_"
# the keys of the index topology, removed: naming one is an error that says so
REMOVED_KEYS = {"kafka": frozenset({
    "sequence_topic", "sketch_topic", "align_topic", "aligned_topic", "forward_topic",
    "index_shards", "keys_topic", "partials_topic", "shard_partials_kept", "align_partitions"})}
SECRET_KEYS = ("sasl_plain_password", "ssl_password", "sasl_oauth_token")


def _rng(lo: float, hi: float) -> dict[str, Any]:
    return {"range": (lo, hi)}


def _one_of(*choices: str) -> dict[str, Any]:
    return {"choices": choices}


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = field(default="127.0.0.1:9092", metadata={"nonempty": True})
    input_topic: str = field(default="pages", metadata={"nonempty": True})
    output_topic: str = field(default="matches", metadata={"nonempty": True})
    dlq_topic: str = field(default="pages.dlq", metadata={"nonempty": True})
    group_id: str = field(default="dupalign", metadata={"nonempty": True})
    client_id: str = "dupalign-worker"
    auto_offset_reset: str = field(default="earliest", metadata=_one_of("earliest", "latest"))
    # Matches, dead letters and the consumed offsets commit in one transaction per input
    # partition (pre-KIP-447: one transactional id per partition). Off: at-least-once.
    transactions: bool = True
    transactional_id_prefix: str = field(default="dupalign", metadata={"nonempty": True})
    transaction_timeout_ms: int = field(default=60_000, metadata=_rng(1_000, 900_000))
    # create missing topics at start-up: a first start works as the README shows it; set
    # false where topics are made by your tooling (and the principal may not create them)
    create_topics: bool = True
    # compression.type of the compacted changelogs the stage roles create: the broker
    # compresses what it keeps (docs/performance/changelog.md); "producer": as sent
    retained_compression: str = field(default="zstd", metadata=_one_of(
        "producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"))
    # The stage roles (``dupalign stage``, docs/pipeline.md): the partitions of each stage,
    # directory, exact, near (a power of 2), lists, combine, router, align: the most copies
    # of each role that get work. Fixed per deployment (the topics are made with it)
    shape: str = field(default="2,2,2,2,2,2,2", metadata={"nonempty": True})
    topic_partitions: int = field(default=1, metadata=_rng(1, 10_000))
    replication_factor: int = field(default=1, metadata=_rng(1, 32))
    session_timeout_ms: int = field(default=10_000, metadata=_rng(1_000, 3_600_000))
    heartbeat_interval_ms: int = field(default=3_000, metadata=_rng(100, 600_000))
    max_poll_interval_ms: int = field(default=300_000, metadata=_rng(1_000, 86_400_000))
    request_timeout_ms: int = field(default=40_000, metadata=_rng(1_000, 3_600_000))
    # how long Kafka may be unreachable or fail with retriable errors (a broker restart)
    # before the process gives up and exits; meanwhile it retries, its store kept open
    max_outage_s: float = field(default=300.0, metadata=_rng(0, 86_400))
    # meanwhile, the wait between attempts doubles from 0.5 s up to this
    outage_backoff_max_s: float = field(default=10.0, metadata=_rng(0.5, 600))
    max_partition_fetch_bytes: int = field(default=1 << 20, metadata=_rng(1024, 1 << 30))
    fetch_max_bytes: int = field(default=50 << 20, metadata=_rng(1024, 1 << 31))
    max_request_size: int = field(default=1 << 20, metadata=_rng(1024, 1 << 30))
    linger_ms: int = field(default=5, metadata=_rng(0, 60_000))
    compression_type: str = field(
        default="none", metadata=_one_of("none", "gzip", "snappy", "lz4", "zstd")
    )
    security_protocol: str = field(
        default="PLAINTEXT", metadata=_one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    )
    sasl_mechanism: str = field(
        default="PLAIN",
        metadata=_one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"),
    )
    sasl_plain_username: str = ""
    sasl_plain_password: str = ""
    # a file holding the password instead (a mounted Kubernetes Secret): read at start-up,
    # its trailing newline dropped; never together with sasl_plain_password
    sasl_password_file: str = ""
    sasl_kerberos_service_name: str = "kafka"
    sasl_kerberos_domain_name: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_password: str = ""
    ssl_password_file: str = ""  # as sasl_password_file, for ssl_password
    ssl_check_hostname: bool = True

    def validate(self) -> None:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "kafka.heartbeat_interval_ms",
                f"{self.heartbeat_interval_ms} must be below kafka.session_timeout_ms "
                f"({self.session_timeout_ms})",
            )
        if len({self.input_topic, self.output_topic, self.dlq_topic}) != 3:
            raise ConfigError("kafka.output_topic", "input, output and DLQ topics must differ")
        check_shape(self.shape)
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            for key in ("sasl_plain_username", "sasl_plain_password"):
                if not getattr(self, key):
                    raise ConfigError(
                        f"kafka.{key}", f"required with security_protocol={self.security_protocol}"
                        f" and sasl_mechanism={self.sasl_mechanism}",
                    )
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, key)
            if path and not Path(path).is_file():
                raise ConfigError(f"kafka.{key}", f"{path!r} is not a readable file")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("kafka.ssl_certfile", "required when kafka.ssl_keyfile is set")

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security settings shared by every aiokafka client."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol.startswith("SASL_"):
            kw["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_plain_username:
                kw["sasl_plain_username"] = self.sasl_plain_username
                kw["sasl_plain_password"] = self.sasl_plain_password
            if self.sasl_mechanism == "GSSAPI":
                kw["sasl_kerberos_service_name"] = self.sasl_kerberos_service_name
                if self.sasl_kerberos_domain_name:
                    kw["sasl_kerberos_domain_name"] = self.sasl_kerberos_domain_name
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kw["ssl_context"] = self.ssl_context()
        return kw

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ssl_cafile or None)
        if self.ssl_certfile:
            ctx.load_cert_chain(
                self.ssl_certfile, self.ssl_keyfile or None, self.ssl_password or None
            )
        ctx.check_hostname = self.ssl_check_hostname
        return ctx


def check_shape(text: str) -> tuple[int, ...]:
    """``kafka.shape`` (or ``--shape``): D,E,P,S,C[,R[,A]] partition counts, each >= 1, P a
    power of 2 (R and A: 1 if not given). Checked here without the engine
    (``dupalign.stages.partitioned.Shape`` parses it for the roles)."""
    parts = [p.strip() for p in text.split(",")]
    counts = [int(p) for p in parts if p.isdigit()]
    if len(parts) not in (5, 6, 7) or len(counts) != len(parts) or min(counts) < 1:
        raise ConfigError("kafka.shape", f"{text!r}: give D,E,P,S,C[,R[,A]], the partitions of "
                          "the directory, exact, near, lists, combine, router and align "
                          "stages, each at least 1")
    if counts[2] & (counts[2] - 1):
        raise ConfigError("kafka.shape", f"{text!r}: the near stage's count ({counts[2]}) "
                          "must be a power of 2")
    return tuple(counts)


@dataclass(frozen=True)
class WorkerConfig:
    batch_size: int = field(default=64, metadata=_rng(1, 100_000))  # records per engine call
    # processes for the engine's sketch and align stages (0: one per core); the index
    # stage stays on the engine thread, so the matches do not depend on it
    jobs: int = field(default=0, metadata=_rng(0, 1024))
    queue_batches: int = field(default=4, metadata=_rng(1, 1_000))  # fetched, not yet processed
    max_message_bytes: int = field(default=8 << 20, metadata=_rng(1024, 1 << 30))
    dlq_raw_max_bytes: int = field(default=512 << 10, metadata=_rng(0, 1 << 30))
    on_engine_error: str = field(default="dlq", metadata=_one_of("dlq", "fail"))
    shutdown_timeout_s: float = field(default=30.0, metadata=_rng(1, 3600))
    lag_interval_s: float = field(default=5.0, metadata=_rng(0.1, 3600))
    store_size_interval_s: float = field(default=30.0, metadata=_rng(0.1, 86_400))
    # refuse to start with less free space on the store's filesystem (RocksDB needs room to
    # flush and compact; a full disk stops the worker mid-stream)
    min_free_mb: int = field(default=100, metadata=_rng(0, 1 << 30))
    log_level: str = field(default="INFO", metadata=_one_of("DEBUG", "INFO", "WARNING", "ERROR"))
    log_format: str = field(default="json", metadata=_one_of("json", "text"))


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True
    host: str = "127.0.0.1"  # loopback by default; set 0.0.0.0 in containers
    port: int = field(default=9464, metadata=_rng(0, 65535))  # 0 = any free port


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def validate(self) -> Config:
        self.kafka.validate()
        room = self.kafka.max_request_size - DEAD_LETTER_OVERHEAD
        if room < 0:
            raise ConfigError(
                "kafka.max_request_size",
                f"{self.kafka.max_request_size} leaves no room for a dead letter: at least "
                f"{DEAD_LETTER_OVERHEAD} (its detail, key and page id) plus "
                "worker.dlq_raw_max_bytes")
        if self.worker.dlq_raw_max_bytes > room:
            raise ConfigError(
                "worker.dlq_raw_max_bytes",
                f"{self.worker.dlq_raw_max_bytes} must leave room for the rest of a dead "
                f"letter: at most kafka.max_request_size ({self.kafka.max_request_size}) "
                f"minus {DEAD_LETTER_OVERHEAD}, {room}",
            )
        self.engine.validate()
        return self

    def redacted(self) -> dict[str, Any]:
        """The effective configuration for logs, secrets masked."""
        out = asdict(self)
        for key in SECRET_KEYS:
            if out["kafka"].get(key):
                out["kafka"][key] = "***"
        return out


TABLES: dict[str, type] = {"kafka": KafkaConfig, "worker": WorkerConfig, "metrics": MetricsConfig}
ENGINE_SECTIONS = tuple(SECTIONS)


def _check_value(table: str, key: str, value: Any, default: Any, meta: Mapping[str, Any]) -> Any:
    name = f"{table}.{key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(name, f"{value!r} is not true/false")
    elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(name, f"{value!r} is not an integer")
    elif isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(name, f"{value!r} is not a number")
        value = float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(name, f"{value!r} is not a string")
    if "range" in meta:
        lo, hi = meta["range"]
        if not lo <= value <= hi:
            raise ConfigError(name, f"{value!r} is out of range [{lo}, {hi}]")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(meta['choices'])}")
    if meta.get("nonempty") and not value:
        raise ConfigError(name, "must not be empty")
    return value


def _build(table: str, cls: type, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(table, "must be a table")
    known = {f.name: f for f in fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        _refuse_removed(table, key)
        if key not in known:
            raise ConfigError(f"{table}.{key}", f"unknown key; known: {', '.join(known)}")
        kwargs[key] = _check_value(table, key, value, getattr(defaults, key), known[key].metadata)
    return cls(**kwargs)


def _refuse_removed(table: str, key: str) -> None:
    if key in REMOVED_KEYS.get(table, ()):
        raise ConfigError(f"{table}.{key}", REMOVED_TOPOLOGY)


def _env_value(raw: str, default: Any) -> Any:
    """Strings stay verbatim (a password may look like a number); other types parse as TOML."""
    if isinstance(default, str):
        return raw
    try:
        return tomllib.loads(f"x = {raw}")["x"]
    except tomllib.TOMLDecodeError:
        return raw


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    engine_defaults = EngineConfig()
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :].lower()
        table, _, rest = name.partition("_")
        if table in TABLES:
            cls = TABLES[table]
            defaults = cls()
            _refuse_removed(table, rest)
            if rest not in {f.name for f in fields(cls)}:
                raise ConfigError(f"{table}.{rest}", f"unknown key (from environment {var})")
            data.setdefault(table, {})[rest] = _env_value(env[var], getattr(defaults, rest))
        elif table == "engine":
            section, _, key = rest.partition("_")
            eng = data.setdefault("engine", {})
            if section in ENGINE_SECTIONS and key:
                default = getattr(getattr(engine_defaults, section), key, "")
                eng.setdefault(section, {})[key] = _env_value(env[var], default)
            else:  # top-level engine key such as seed
                eng[rest] = _env_value(env[var], getattr(engine_defaults, rest, ""))
        # Other DUPALIGN_* variables (e.g. DUPALIGN_CONFIG) belong to other tools.


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Defaults < TOML file < environment < ``overrides`` (command-line flags)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from None
    for table in data:
        if table not in TABLES and table != "engine":
            raise ConfigError(table, f"unknown table; known: {', '.join([*TABLES, 'engine'])}")
    _apply_env(data, os.environ if env is None else env)
    for table, values in (overrides or {}).items():
        data.setdefault(table, {}).update(values)
    built = {t: _build(t, cls, data.get(t, {})) for t, cls in TABLES.items()}
    engine_data = data.get("engine", {})
    if not isinstance(engine_data, Mapping):
        raise ConfigError("engine", "must be a table")
    try:
        engine = EngineConfig.from_dict(dict(engine_data))
    except ConfigError as exc:
        raise ConfigError(f"engine.{exc.key}", exc.message) from None
    built["kafka"] = _read_secret_files(built["kafka"])
    return Config(engine=engine, **built).validate()


SECRET_FILES = {"sasl_password_file": "sasl_plain_password", "ssl_password_file": "ssl_password"}


def _read_secret_files(kc: KafkaConfig) -> KafkaConfig:
    """The passwords named by ``*_password_file`` keys, read into their keys: how
    Kubernetes mounts a Secret (deploy/k8s). The file's last newline is not part of it."""
    changes: dict[str, Any] = {}
    for key, target in SECRET_FILES.items():
        path = getattr(kc, key)
        if not path:
            continue
        if getattr(kc, target):
            raise ConfigError(f"kafka.{key}", f"give kafka.{target} or kafka.{key}, not both")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(f"kafka.{key}", f"cannot read {path}: {reason}") from None
        secret = text[:-1] if text.endswith("\n") else text
        if not secret:
            raise ConfigError(f"kafka.{key}", f"{path} is empty")
        changes[target] = secret
    return replace(kc, **changes) if changes else kc


def with_kafka(config: Config, **changes: Any) -> Config:
    """A copy with some [kafka] values replaced (validated)."""
    return replace(config, kafka=replace(config.kafka, **changes)).validate()
