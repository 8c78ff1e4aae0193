"""Kafka's security failures, each said in one line that names the fix: a broker certificate
the client does not trust, SASL credentials the broker refuses, and an operation no ACL
allows. Never a secret in the line: the user name and mechanism only.

``check_security`` runs before a worker or ``produce`` starts its clients: aiokafka
retries a refused handshake or login in its logs and then raises only "Unable to
bootstrap", losing the cause. ``refusal`` recognises an authorization error a running
client raises (a topic, group, transactional id or the cluster).
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)

from dupalign.service.config import KafkaConfig
from dupalign.service.exits import CliError, Exit

# what each authorization error says was refused
REFUSED = {
    TopicAuthorizationFailedError: "a topic",
    GroupAuthorizationFailedError: "a consumer group",
    TransactionalIdAuthorizationFailed: "a transactional id",
    ClusterAuthorizationFailedError: "a cluster operation",
}
ACL_HINT = ("grant the ACLs `dupalign acls --role ROLE --principal User:NAME` prints "
            "(docs/security.md)")


def who(kc: KafkaConfig) -> str:
    if kc.security_protocol.startswith("SASL_") and kc.sasl_plain_username:
        return f"user {kc.sasl_plain_username!r}"
    return f"the {kc.security_protocol} client"


def refusal(exc: BaseException, kc: KafkaConfig) -> str | None:
    """The one line for an authorization error (None: ``exc`` is not one)."""
    for cls, what in REFUSED.items():
        if isinstance(exc, cls):
            detail = str(exc).split(": ", 1)[-1] if ": " in str(exc) else ""
            named = f" ({detail})" if detail and detail != cls.__name__ else ""
            return (f"Kafka refused {what}{named} to {who(kc)}: {cls.__name__}, no ACL "
                    f"allows it; {ACL_HINT}")
    return None


async def _handshake(kc: KafkaConfig, server: str) -> str | None:
    """Connect and authenticate to one bootstrap server: None, or why it failed."""
    host, _, port = server.rpartition(":")
    kw = kc.client_kwargs()
    del kw["bootstrap_servers"]
    try:
        conn = await asyncio.wait_for(create_conn(host.strip("[]"), int(port), **kw),
                                      kc.request_timeout_ms / 1000)
    except ssl.SSLCertVerificationError as exc:
        return (f"the TLS certificate of {server} is not trusted ({exc.verify_message}): set "
                "kafka.ssl_cafile to the CA certificate that signed it (kafka."
                "ssl_check_hostname = false only if the name is what does not match)")
    except ssl.SSLError as exc:
        return (f"no TLS handshake with {server} ({exc.reason or exc}): is it a "
                f"{kc.security_protocol} listener?")
    except SaslAuthenticationFailed:
        return (f"{server} refused the {kc.sasl_mechanism} credentials of {who(kc)}: check "
                "kafka.sasl_plain_username and the password (kafka.sasl_plain_password or "
                "kafka.sasl_password_file)")
    except UnsupportedSaslMechanismError:
        return f"{server} does not offer SASL mechanism {kc.sasl_mechanism} (kafka.sasl_mechanism)"
    except TimeoutError:
        return (f"no {kc.security_protocol} handshake with {server} within "
                f"{kc.request_timeout_ms} ms: is it a {kc.security_protocol} listener?")
    except (KafkaError, OSError) as exc:
        return f"{server}: {type(exc).__name__}: {exc}"
    conn.close()
    return None


async def check_security(kc: KafkaConfig) -> None:
    """Raise CliError(KAFKA) unless a bootstrap server completes the TLS handshake and the
    SASL login (nothing to check for PLAINTEXT: ``check_broker_reachable`` did)."""
    if kc.security_protocol == "PLAINTEXT":
        return
    reasons = []
    for server in (s.strip() for s in kc.bootstrap_servers.split(",") if s.strip()):
        reason = await _handshake(kc, server)
        if reason is None:
            return
        reasons.append(reason)
    raise CliError(f"Kafka {kc.security_protocol}: {'; '.join(reasons)}", Exit.KAFKA)


class _Refusals(logging.Filter):
    """Drops aiokafka's "Topic X is not authorized for this client": the client raises
    TopicAuthorizationFailedError too, and the process says it once, with the fix."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Topic %s is not authorized for this client"


def quiet_refusals() -> None:
    logging.getLogger("aiokafka.cluster").addFilter(_Refusals())
