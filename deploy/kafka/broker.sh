#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft, combined broker+controller) for tests and
# development, built from the official Maven Central artifacts (see pom.xml next to this file).
#
#   broker.sh start DIR    format DIR (first time), start the broker in the background on free
#                          loopback ports, wait until it answers requests, write DIR/bootstrap
#                          and print the bootstrap address
#   broker.sh stop DIR     stop it (SIGTERM, then SIGKILL after BROKER_STOP_TIMEOUT seconds)
#   broker.sh status DIR   exit 0 and print the bootstrap address if it is running
#   broker.sh classpath    only resolve and cache the jars (e.g. to warm a CI cache)
#   broker.sh kafka-acls DIR ARGS... [';' ARGS...]...
#                          run kafka-acls.sh (org.apache.kafka.tools.AclCommand) with ARGS as
#                          given, e.g. what `dupalign acls` prints; several commands, separated
#                          by an argument ';', in one JVM (stops at the first that fails)
#
# With BROKER_SASL_SSL=1 when DIR is first started, the broker also has a SASL_SSL listener
# (SCRAM-SHA-512 over TLS) and the standard authorizer with allow.everyone.if.no.acl.found=
# false: on it, a user may do only what an ACL grants. The plaintext listener stays as it
# is, its (anonymous) principal a super user, so the admin side and every other client
# work unchanged. Made on the spot in DIR/sasl/:
#   ca.pem        the CA certificate a client trusts (kafka.ssl_cafile)
#   ca.p12, broker.p12   the CA's and the broker's keys (PKCS12, password in store.password)
#   bootstrap     the SASL_SSL listener's address (127.0.0.1:PORT; the certificate names
#                 127.0.0.1 and localhost)
#   users         the SCRAM users, one NAME:PASSWORD a line (mode 600)
# BROKER_SCRAM_USERS="alice:secret1 bob:secret2" names the users (default: one user "admin"
# with a random password); `admin` is a super user as well when it is one of them.
#
# Environment:
#   KAFKA_BROKER_CACHE   where the jars are cached (default ~/.cache/dupalign/kafka-<pom hash>)
#   KAFKA_HEAP_OPTS        JVM heap (default -Xmx512m -Xms128m)
#   BROKER_START_TIMEOUT   seconds to wait for readiness (default 120)
#   BROKER_STOP_TIMEOUT    seconds to wait for a clean stop (default 30)
#   BROKER_SASL_SSL        1: the SASL_SSL listener above (read when DIR is first started)
#   BROKER_SCRAM_USERS     its SCRAM-SHA-512 users, NAME:PASSWORD separated by spaces
#
# Exit codes: 0 ok, 1 usage/state error, 2 Java or Maven missing, 3 artifact resolution failed,
# 4 broker did not start (the tail of DIR/broker.log is printed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$HERE/pom.xml"

die() { local code=$1; shift; echo "broker.sh: $*" >&2; exit "$code"; }

# The JVM's quick compiler only (C1): most of a test broker's CPU was its optimizing
# compiler (C2) at work on its hot paths. Three roles and 32 pages: 7.8 s of broker CPU to
# start and 16.0 s for the pages with C2; 4.3 s and 5.3 s with C1 only.
C1_ONLY=(-XX:TieredStopAtLevel=1)

need_tools() {
  command -v java >/dev/null 2>&1 || die 2 "java not found on PATH (need Java 17+)"
  local major
  major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  [[ "${major%%.*}" -ge 17 ]] 2>/dev/null || die 2 "Java 17+ required, found ${major:-unknown}"
}

cache_dir() {
  if [[ -n "${KAFKA_BROKER_CACHE:-}" ]]; then
    echo "$KAFKA_BROKER_CACHE"
  else
    local h
    h=$(sha256sum "$POM" | cut -c1-12)
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/dupalign/kafka-$h"
  fi
}

# Resolve the broker's runtime jars once; later runs reuse the cache without starting Maven.
resolve_classpath() {
  local cache lib
  cache=$(cache_dir)
  lib="$cache/lib"
  if [[ -f "$cache/.complete" ]]; then
    echo "$lib"
    return
  fi
  command -v mvn >/dev/null 2>&1 || die 2 "mvn not found on PATH (needed once to fetch Kafka from Maven Central)"
  mkdir -p "$cache"
  rm -rf "$lib"
  echo "broker.sh: resolving Kafka jars from Maven Central into $lib ..." >&2
  if ! mvn -B -q -f "$POM" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$lib" >"$cache/mvn.log" 2>&1; then
    echo "broker.sh: Maven could not resolve the Kafka artifacts; the error was:" >&2
    grep -E 'ERROR|Could not|resolve' "$cache/mvn.log" | head -20 >&2 || tail -20 "$cache/mvn.log" >&2
    die 3 "artifact resolution failed (full log: $cache/mvn.log)"
  fi
  ls "$lib"/kafka_2.13-*.jar >/dev/null 2>&1 || die 3 "kafka_2.13 jar missing after resolution"
  touch "$cache/.complete"
  echo "$lib"
}

# kafka-acls.sh ARGS... [';' ARGS...]...: one JVM for them all (AclCommands.java, compiled
# once into the cache) where javac is at hand, else a JVM for each
kafka_acls() {
  local lib=$1 src="$HERE/AclCommands.java" classes tmp
  shift
  # (log4j2 without a configuration: errors only, on the console)
  local java=(java -Xmx256m "${C1_ONLY[@]}" -Dlog4j2.statusLoggerLevel=OFF)
  classes="$(cache_dir)/acl-commands-$(sha256sum "$src" | cut -c1-12)"
  if [[ ! -f "$classes/AclCommands.class" ]] && command -v javac >/dev/null 2>&1; then
    tmp="$classes.tmp.$$"  # (moved in whole: concurrent runs may compile it too)
    if javac --release 17 -nowarn -cp "$lib/*" -d "$tmp" "$src" >&2; then
      mv -T "$tmp" "$classes" 2>/dev/null || true
    fi
    rm -rf "$tmp"
  fi
  if [[ -f "$classes/AclCommands.class" ]]; then
    exec "${java[@]}" -cp "$classes:$lib/*" AclCommands "$@"
  fi
  local args=() arg
  for arg in "$@" ";"; do
    if [[ "$arg" != ";" ]]; then args+=("$arg"); continue; fi
    "${java[@]}" -cp "$lib/*" org.apache.kafka.tools.AclCommand "${args[@]}" || return
    args=()
  done
}

free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    return
  fi
  local p
  for _ in $(seq 50); do
    p=$(( (RANDOM % 20000) + 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die 1 "no free port found"
}

# An ApiVersions v0 request (api key 18, correlation id 7, null client id); ready when the
# broker answers with the same correlation id and error code 0.
probe() {
  local host=$1 port=$2 fd resp
  exec {fd}<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
  printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x07\xff\xff' >&"$fd"
  resp=$(timeout 3 head -c 10 <&"$fd" | od -An -tx1 | tr -d ' \n') || true
  exec {fd}>&-
  [[ "${resp:8:8}" == "00000007" && "${resp:16:4}" == "0000" ]]
}

# a running process (a child that exited stays a zombie until this shell reaps it)
alive() {
  [[ -r "/proc/$1/status" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"
}

pid_of() {
  local dir=$1 pid
  [[ -f "$dir/broker.pid" ]] || return 1
  pid=$(cat "$dir/broker.pid")
  # Only a java process running kafka.Kafka with this DIR's config counts as ours.
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "kafka.Kafka $dir/server.properties" || return 1
  echo "$pid"
}

write_config() {
  local dir=$1 bport cport sport=""
  bport=$(free_port)
  cport=$(free_port)
  while [[ "$cport" == "$bport" ]]; do cport=$(free_port); done
  local listeners="PLAINTEXT://127.0.0.1:$bport,CONTROLLER://127.0.0.1:$cport"
  local advertised="PLAINTEXT://127.0.0.1:$bport"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [[ "${BROKER_SASL_SSL:-0}" == 1 ]]; then
    sport=$(free_port)
    while [[ "$sport" == "$bport" || "$sport" == "$cport" ]]; do sport=$(free_port); done
    listeners+=",SASL_SSL://127.0.0.1:$sport"
    advertised+=",SASL_SSL://127.0.0.1:$sport"
    protocols+=",SASL_SSL:SASL_SSL"
  fi
  cat >"$dir/server.properties" <<EOF
# Written by deploy/kafka/broker.sh: single-node KRaft broker for tests/development.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$dir/data
num.network.threads=2
num.io.threads=2
num.partitions=1
auto.create.topics.enable=true
# One replica, and small internal topics: a fast start and a fast first consumer group.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=24
EOF
  if [[ -n "$sport" ]]; then write_sasl_config "$dir" "$sport"; fi
  cat >"$dir/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $dir/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
  echo "127.0.0.1:$bport" >"$dir/bootstrap.next"
}

# The SASL_SSL listener's keys, users and settings (BROKER_SASL_SSL=1), made once per DIR.
write_sasl_config() {
  local dir=$1 sport=$2 sdir="$1/sasl" pass users
  mkdir -p "$sdir"
  chmod 700 "$sdir"
  pass=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  echo "$pass" >"$sdir/store.password"
  make_certificates "$sdir" "$pass"
  users=${BROKER_SCRAM_USERS:-"admin:$(head -c 12 /dev/urandom | base64 | tr '+/' '-_')"}
  (umask 077; tr ' ' '\n' <<<"$users" | grep -v '^$' >"$sdir/users")
  if grep -q -v '^[A-Za-z0-9._-]\+:[^][,=[:space:]]\+$' "$sdir/users"; then
    die 1 "BROKER_SCRAM_USERS: give NAME:PASSWORD pairs (no spaces, commas, = or brackets)"
  fi
  echo "127.0.0.1:$sport" >"$sdir/bootstrap"
  cat >>"$dir/server.properties" <<EOF
# SASL_SSL (BROKER_SASL_SSL=1): SCRAM-SHA-512 over TLS, ACLs enforced; the plaintext and
# controller listeners' anonymous principal is a super user (the admin side).
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$sdir/broker.p12
ssl.keystore.password=$pass
ssl.key.password=$pass
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:admin
EOF
}

# A CA and a broker certificate signed by it (for 127.0.0.1 and localhost), with the JDK's
# keytool: ca.pem for the clients, broker.p12 (the broker's key and chain) for the broker.
make_certificates() {
  local sdir=$1 kt=(keytool -noprompt -storetype PKCS12 -storepass "$2" -keypass "$2")
  command -v keytool >/dev/null 2>&1 || die 2 "keytool not found on PATH (part of the JDK)"
  rm -f "$sdir"/ca.p12 "$sdir"/broker.p12
  "${kt[@]}" -genkeypair -keystore "$sdir/ca.p12" -alias ca -keyalg RSA -keysize 2048 \
    -validity 3650 -dname "CN=dupalign test CA" -ext bc:c >/dev/null 2>&1 \
    || die 4 "keytool could not make the CA"
  "${kt[@]}" -exportcert -keystore "$sdir/ca.p12" -alias ca -rfc -file "$sdir/ca.pem" \
    >/dev/null 2>&1 || die 4 "keytool could not export the CA certificate"
  "${kt[@]}" -genkeypair -keystore "$sdir/broker.p12" -alias broker -keyalg RSA -keysize 2048 \
    -validity 3650 -dname "CN=localhost" >/dev/null 2>&1 || die 4 "keytool: broker key"
  "${kt[@]}" -certreq -keystore "$sdir/broker.p12" -alias broker -file "$sdir/broker.csr" \
    >/dev/null 2>&1 || die 4 "keytool: broker certificate request"
  "${kt[@]}" -gencert -keystore "$sdir/ca.p12" -alias ca -infile "$sdir/broker.csr" -rfc \
    -validity 3650 -ext "SAN=IP:127.0.0.1,DNS:localhost" -ext "EKU=serverAuth" \
    -outfile "$sdir/broker.pem" >/dev/null 2>&1 || die 4 "keytool: signing the broker certificate"
  "${kt[@]}" -importcert -keystore "$sdir/broker.p12" -alias ca -file "$sdir/ca.pem" \
    >/dev/null 2>&1 || die 4 "keytool: importing the CA"
  "${kt[@]}" -importcert -keystore "$sdir/broker.p12" -alias broker -file "$sdir/broker.pem" \
    >/dev/null 2>&1 || die 4 "keytool: importing the broker certificate"
  rm -f "$sdir/broker.csr"
}

# StorageTool's --add-scram arguments for DIR/sasl/users, one a line (none without it).
scram_args() {
  local dir=$1 name pass
  [[ -f "$dir/sasl/users" ]] || return 0
  while IFS=: read -r name pass; do
    [[ -n "$name" ]] && printf '%s\n' "--add-scram" "SCRAM-SHA-512=[name=$name,password=$pass]"
  done <"$dir/sasl/users"
}

start() {
  local dir=$1 lib cp pid bootstrap deadline
  need_tools
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if pid=$(pid_of "$dir"); then
    cat "$dir/bootstrap"
    return
  fi
  lib=$(resolve_classpath)
  cp="$lib/*"
  [[ -f "$dir/server.properties" ]] || write_config "$dir"
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    local cluster_id
    # base64url of 16 random bytes may begin with '-': pass it as --cluster-id=ID so the
    # argument parser cannot mistake it for an option (a CI run failed on exactly that).
    cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    local scram=()
    mapfile -t scram < <(scram_args "$dir")
    if ! java -Xmx256m "${C1_ONLY[@]}" -cp "$cp" \
        -Dlog4j2.configurationFile="file:$dir/log4j2.properties" kafka.tools.StorageTool format --cluster-id="$cluster_id" \
        --config "$dir/server.properties" --standalone "${scram[@]}" >"$dir/format.log" 2>&1; then
      cat "$dir/format.log" >&2
      die 4 "storage format failed"
    fi
  fi
  # A restart reuses the recorded ports (the controller's address is part of its voter set).
  bootstrap=$(cat "$dir/bootstrap.next")
  rm -f "$dir/bootstrap"
  [[ -f "$dir/broker.log" ]] && mv -f "$dir/broker.log" "$dir/broker.log.1"
  # setsid: detach from the caller's process group so Ctrl-C in a test run does not kill it
  # half-way; `broker.sh stop` is the way to end it.
  # shellcheck disable=SC2086
  setsid java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m} "${C1_ONLY[@]}" -XX:+UseG1GC \
    -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dkafka.logs.dir="$dir" \
    -Dlog4j2.configurationFile="file:$dir/log4j2.properties" \
    -cp "$cp" kafka.Kafka "$dir/server.properties" >"$dir/broker.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/broker.pid"
  deadline=$(( $(date +%s) + ${BROKER_START_TIMEOUT:-120} ))
  while :; do
    # alive, not pid_of: until the fork has exec'ed java, the child's cmdline is this shell's
    if ! alive "$pid"; then
      tail -40 "$dir/broker.log" "$dir/broker.out" >&2 2>/dev/null || true
      die 4 "broker exited during start-up (logs in $dir)"
    fi
    if grep -q "Kafka Server started" "$dir/broker.log" 2>/dev/null \
        && probe "${bootstrap%:*}" "${bootstrap##*:}" 2>/dev/null; then
      break
    fi
    if (( $(date +%s) > deadline )); then
      tail -40 "$dir/broker.log" >&2 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
      die 4 "broker not ready after ${BROKER_START_TIMEOUT:-120}s (logs in $dir)"
    fi
    sleep 0.25
  done
  echo "$bootstrap" >"$dir/bootstrap"
  echo "$bootstrap"
}

stop() {
  local dir=$1 pid deadline
  [[ -d "$dir" ]] || die 1 "no such directory: $dir"
  dir=$(cd "$dir" && pwd)
  if ! pid=$(pid_of "$dir"); then
    rm -f "$dir/broker.pid" "$dir/bootstrap"
    return
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$(( $(date +%s) + ${BROKER_STOP_TIMEOUT:-30} ))
  while kill -0 "$pid" 2>/dev/null; do
    if (( $(date +%s) > deadline )); then
      echo "broker.sh: broker $pid did not stop in time; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$dir/broker.pid" "$dir/bootstrap"
}

status() {
  local dir=$1
  dir=$(cd "$dir" 2>/dev/null && pwd) || exit 1
  pid_of "$dir" >/dev/null || exit 1
  cat "$dir/bootstrap"
}

case "${1:-}" in
  start) [[ $# -eq 2 ]] || die 1 "usage: broker.sh start DIR"; start "$2" ;;
  stop) [[ $# -eq 2 ]] || die 1 "usage: broker.sh stop DIR"; stop "$2" ;;
  status) [[ $# -eq 2 ]] || die 1 "usage: broker.sh status DIR"; status "$2" ;;
  classpath) need_tools; resolve_classpath ;;
  kafka-acls)
    [[ $# -ge 2 ]] || die 1 "usage: broker.sh kafka-acls DIR ARGS..."
    need_tools
    [[ -d "$2" ]] || die 1 "no such directory: $2"
    lib=$(resolve_classpath)
    shift 2
    kafka_acls "$lib" "$@" ;;
  *) die 1 "usage: broker.sh {start|stop|status} DIR | broker.sh kafka-acls DIR ARGS... | broker.sh classpath" ;;
esac
