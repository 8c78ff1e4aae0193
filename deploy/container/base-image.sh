#!/usr/bin/env bash
# A Debian base image built from Debian packages, for machines that cannot reach an image
# registry: mmdebstrap (minbase) of the host's Debian release, imported into podman.
# It plays the role of debian:<release>-slim, so deploy/Dockerfile builds on it unchanged:
#   podman build --build-arg BASE_IMAGE="$(deploy/container/base-image.sh)" -f deploy/Dockerfile .
#
#   deploy/container/base-image.sh            # prints the image name (builds it on first use)
#   DUPALIGN_BASE_SUITE=bookworm DUPALIGN_BASE_MIRROR=http://deb.debian.org/debian ...
#
# Idempotent: an image already in podman's store is reused. Needs root (mmdebstrap in root
# mode, podman) and the packages mmdebstrap + podman. Exit codes: 2 = a tool is missing,
# 3 = mmdebstrap failed (its log tail is printed), 4 = podman import failed.
set -euo pipefail

suite="${DUPALIGN_BASE_SUITE:-}"
if [[ -z "$suite" ]]; then
    # shellcheck disable=SC1091
    suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
fi
[[ -n "$suite" ]] || { echo "base-image.sh: cannot tell the Debian release; set DUPALIGN_BASE_SUITE" >&2; exit 2; }
mirror="${DUPALIGN_BASE_MIRROR:-http://deb.debian.org/debian}"
image="localhost/dupalign-base:${suite}"

for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || {
        echo "base-image.sh: '$tool' not found (apt-get install mmdebstrap podman)" >&2; exit 2; }
done

if podman image exists "$image"; then
    echo "$image"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The host's locally added CA certificates (Debian's place for them) go into the image too,
# so that a build behind a TLS-intercepting proxy the host trusts can reach PyPI; the
# Dockerfile's `apt-get install ca-certificates` adds them to the system bundle. On most
# machines there are none.
hooks=()
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    hooks+=(--customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share')
fi
# minbase = essential packages + apt: what debian:<suite>-slim holds, so that the
# Dockerfile's apt-get works. Security updates as on the host.
if ! mmdebstrap --variant=minbase --mode=root --format=tar \
        --aptopt='Acquire::Retries "3"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "${hooks[@]}" \
        "$suite" "$work/rootfs.tar" \
        "deb $mirror $suite main" "deb $mirror $suite-updates main" \
        "deb ${mirror%/debian}/debian-security $suite-security main" \
        >"$work/mmdebstrap.log" 2>&1; then
    echo "base-image.sh: mmdebstrap $suite failed:" >&2
    tail -n 30 "$work/mmdebstrap.log" >&2
    exit 3
fi
if ! podman import -q --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --message "mmdebstrap minbase $suite" "$work/rootfs.tar" "$image" >/dev/null; then
    echo "base-image.sh: podman import failed" >&2
    exit 4
fi
echo "$image"
