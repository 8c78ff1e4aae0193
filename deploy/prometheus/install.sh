#!/usr/bin/env bash
# Prometheus and promtool from Debian's `prometheus` package, for the ops tests
# (tests/service/test_ops_prometheus.py) and for checking the rules by hand. Prints the directory
# that holds both binaries.
#
#   deploy/prometheus/install.sh            # e.g. /root/.cache/dupalign/prometheus-2.42.0+ds-5+deb12u1/bin
#
# Where they come from, first hit wins:
#   1. `prometheus` and `promtool` on PATH (e.g. after `apt-get install prometheus`);
#   2. the cache, ~/.cache/dupalign/prometheus-<version>/bin (PROMETHEUS_CACHE overrides the
#      parent directory);
#   3. `apt-get download prometheus` (no root needed, nothing installed system-wide, no
#      service started), unpacked with dpkg-deb into the cache.
# Exit codes: 2 = not available here (no apt/dpkg, or no `prometheus` package in the apt
# lists: run `apt-get update`), 3 = the download or unpacking failed (the error is printed).
set -euo pipefail

prom="$(command -v prometheus || true)"
tool="$(command -v promtool || true)"
if [[ -n "$prom" && -n "$tool" && "$(dirname "$prom")" == "$(dirname "$tool")" ]]; then
    dirname "$tool"
    exit 0
fi

for t in apt-cache apt-get dpkg-deb; do
    command -v "$t" >/dev/null || {
        echo "install.sh: '$t' not found: Prometheus comes from Debian's package here" >&2; exit 2; }
done
version="$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')"
if [[ -z "$version" || "$version" == "(none)" ]]; then
    echo "install.sh: no 'prometheus' package in the apt lists (run apt-get update)" >&2
    exit 2
fi

cache="${PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dupalign}/prometheus-$version"
if [[ -x "$cache/bin/prometheus" && -x "$cache/bin/promtool" ]]; then
    echo "$cache/bin"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && apt-get download -q "prometheus=$version") >"$work/download.log" 2>&1; then
    echo "install.sh: apt-get download prometheus=$version failed:" >&2
    tail -n 20 "$work/download.log" >&2
    exit 3
fi
deb=("$work"/prometheus_*.deb)
if ! dpkg-deb -x "${deb[0]}" "$work/root"; then
    echo "install.sh: dpkg-deb could not unpack ${deb[0]}" >&2
    exit 3
fi
mkdir -p "$(dirname "$cache")"
# Unpack next to the cache, then rename: a concurrent or interrupted run never leaves a
# half-written cache behind.
staging="$(mktemp -d "$cache.XXXXXX")"
chmod 755 "$staging"
mkdir -p "$staging/bin"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$staging/bin/"
if ! mv -T "$staging" "$cache" 2>/dev/null; then
    rm -rf "$staging"   # another run got there first
fi
echo "$cache/bin"
