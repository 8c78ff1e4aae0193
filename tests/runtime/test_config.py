"""Worker configuration: TOML + environment + flags, and start-up errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from dupalign.errors import ConfigError
from dupalign.service.config import Config, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dupalign.toml"
    path.write_text(text, "utf-8")
    return path


def test_defaults_are_valid() -> None:
    cfg = load_config(env={})
    assert cfg == Config()
    assert cfg.kafka.input_topic == "pages" and cfg.kafka.dlq_topic == "pages.dlq"
    assert cfg.metrics.host == "127.0.0.1"


def test_toml_tables_and_engine(tmp_path: Path) -> None:
    path = write(tmp_path, """
[kafka]
input_topic = "crawl.pages"
transactions = false
[worker]
batch_size = 16
shutdown_timeout_s = 5
[metrics]
port = 0
[engine]
seed = 7
[engine.near]
hamming = 4
shingle = 5
[engine.passage]
mode = "weighted_oph"
[engine.cache]
lists_mb = 64
""")
    cfg = load_config(path, env={"DUPALIGN_ENGINE_CACHE_BLOCKS_MB": "32"})
    assert cfg.engine.near.shingle == 5
    assert (cfg.engine.cache.lists_mb, cfg.engine.cache.blocks_mb) == (64, 32)
    assert cfg.engine.frozen_params()["near_shingle"] == 5
    assert cfg.engine.frozen_params()["passage_mode"] == "weighted_oph"
    assert cfg.kafka.input_topic == "crawl.pages" and cfg.kafka.transactions is False
    assert cfg.worker.batch_size == 16 and cfg.worker.shutdown_timeout_s == 5.0
    assert cfg.metrics.port == 0
    assert cfg.engine.seed == 7 and cfg.engine.near.hamming == 4


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = write(tmp_path, '[kafka]\ngroup_id = "from-file"\nclient_id = "file"\n')
    env = {"DUPALIGN_KAFKA_GROUP_ID": "from-env", "DUPALIGN_KAFKA_BOOTSTRAP_SERVERS": "e:1"}
    cfg = load_config(path, env=env, overrides={"kafka": {"bootstrap_servers": "flag:9"}})
    assert cfg.kafka.group_id == "from-env"
    assert cfg.kafka.client_id == "file"
    assert cfg.kafka.bootstrap_servers == "flag:9"


def test_env_types_and_secrets_stay_strings() -> None:
    env = {
        "DUPALIGN_WORKER_BATCH_SIZE": "128",
        "DUPALIGN_KAFKA_TRANSACTIONS": "false",
        "DUPALIGN_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "DUPALIGN_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "DUPALIGN_KAFKA_SASL_PLAIN_USERNAME": "crawler",
        "DUPALIGN_KAFKA_SASL_PLAIN_PASSWORD": "12345",
        "DUPALIGN_ENGINE_NEAR_HAMMING": "2",
        "DUPALIGN_ENGINE_PASSAGE_THETA": "1/2",
        "DUPALIGN_ENGINE_SEED": "99",
        "DUPALIGN_CONFIG": "/not/a/table",  # other tools' variables are not ours
        "UNRELATED": "x",
    }
    cfg = load_config(env=env)
    assert cfg.worker.batch_size == 128 and cfg.kafka.transactions is False
    assert cfg.kafka.sasl_plain_password == "12345"
    assert cfg.engine.near.hamming == 2 and cfg.engine.passage.theta == "1/2"
    assert cfg.engine.seed == 99
    kw = cfg.kafka.client_kwargs()
    assert kw["security_protocol"] == "SASL_PLAINTEXT" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_password"] == "12345"
    assert cfg.redacted()["kafka"]["sasl_plain_password"] == "***"


def test_passwords_from_files_as_kubernetes_mounts_secrets(tmp_path: Path) -> None:
    (tmp_path / "sasl").write_text("p@ss word 42\n", "utf-8")  # its last newline dropped
    (tmp_path / "key").write_text("key-pass", "utf-8")
    env = {"DUPALIGN_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "DUPALIGN_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "DUPALIGN_KAFKA_SASL_PLAIN_USERNAME": "sketch",
           "DUPALIGN_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "sasl")}
    path = write(tmp_path, f'[kafka]\nssl_password_file = "{tmp_path / "key"}"\n')
    cfg = load_config(path, env=env)
    assert cfg.kafka.sasl_plain_password == "p@ss word 42"
    assert cfg.kafka.ssl_password == "key-pass"
    assert "p@ss word 42" not in str(cfg.redacted()) and "key-pass" not in str(cfg.redacted())
    for extra, fragment in (({"DUPALIGN_KAFKA_SASL_PLAIN_PASSWORD": "x"}, "not both"),
                            ({"DUPALIGN_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "no")},
                             "cannot read"),
                            ({"DUPALIGN_KAFKA_SASL_PASSWORD_FILE": "/dev/null"}, "is empty")):
        with pytest.raises(ConfigError) as err:
            load_config(path, env={**env, **extra})
        assert err.value.key == "kafka.sasl_password_file" and fragment in err.value.message


@pytest.mark.parametrize(
    ("toml", "env", "key", "fragment"),
    [
        ("[worker]\nbatch_size = 0\n", {}, "worker.batch_size", "[1, 100000]"),
        ("", {"DUPALIGN_WORKER_BATCH_SIZE": "lots"}, "worker.batch_size", "not an integer"),
        ("[worker]\nqueue_batches = 1.5\n", {}, "worker.queue_batches", "not an integer"),
        ("[metrics]\nport = 70000\n", {}, "metrics.port", "[0, 65535]"),
        ('[kafka]\nauto_offset_reset = "middle"\n', {}, "kafka.auto_offset_reset", "earliest"),
        ('[kafka]\ncompression_type = "brotli"\n', {}, "kafka.compression_type", "zstd"),
        ('[kafka]\nretained_compression = "none"\n', {}, "kafka.retained_compression",
         "uncompressed"),
        ("[kafka]\ntransactions = 1\n", {}, "kafka.transactions", "true/false"),
        ('[kafka]\ninput_topic = ""\n', {}, "kafka.input_topic", "empty"),
        ('[kafka]\noutput_topic = "pages"\n', {}, "kafka.output_topic", "differ"),
        ("[kafka]\nheartbeat_interval_ms = 20000\n", {}, "kafka.heartbeat_interval_ms", "below"),
        ("[kafka]\nbogus = 1\n", {}, "kafka.bogus", "unknown key"),
        ("", {"DUPALIGN_WORKER_BATCHSIZE": "3"}, "worker.batchsize", "unknown key"),
        ("[surprise]\nx = 1\n", {}, "surprise", "unknown table"),
        ("[engine.near]\nhamming = 99\n", {}, "engine.near.hamming", "range"),
        ("[engine.near]\nshingle = 0\n", {}, "engine.near.shingle", "range"),
        ('[engine.passage]\nmode = "weighted-oph"\n', {}, "engine.passage.mode", "weighted_oph"),
        ("[engine.cache]\nlists_mb = -1\n", {}, "engine.cache.lists_mb", "range"),
        ("[engine.cache]\nmemory_mb = 400\n", {}, "engine.cache.memory_mb", "no room"),
        ("", {"DUPALIGN_ENGINE_NEAR_HAMMING": "-1"}, "engine.near.hamming", "range"),
        (
            '[kafka]\nsecurity_protocol = "SASL_SSL"\n', {}, "kafka.sasl_plain_username",
            "required",
        ),
        ('[kafka]\nssl_cafile = "/nonexistent/ca.pem"\n', {}, "kafka.ssl_cafile", "file"),
        ("[worker]\ndlq_raw_max_bytes = 2000000\n", {}, "worker.dlq_raw_max_bytes", "room"),
        ("[kafka]\nmax_request_size = 60000\n", {}, "kafka.max_request_size", "no room"),
        ("[kafka\n", {}, "--config", "TOML"),
    ],
)
def test_invalid_values_name_the_key(
    tmp_path: Path, toml: str, env: dict[str, str], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, toml), env=env)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env={})
    assert info.value.key == "--config"
