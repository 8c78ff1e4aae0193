#!/usr/bin/env bash
# Prints the extra `podman build` / `podman run` arguments this host needs; nothing on an
# ordinary host. Use: podman run $(deploy/container/podman-args.sh) ...
#
# Two host limits are recognised (both found in sandboxed VMs):
# * root without CAP_SYS_RESOURCE: podman asks for RLIMIT_NOFILE=1048576 and a large
#   RLIMIT_NPROC in every container, and the runtime fails with
#   "setrlimit `RLIMIT_NOFILE`: Operation not permitted" (then the same for RLIMIT_NPROC
#   once nofile matches the host's hard limit). podman itself lowers its own
#   RLIMIT_NPROC to 32768 at start, so the container gets that and the host's open-files limit.
# * a hybrid cgroup v1/v2 hierarchy, which crun refuses ("cgroups in hybrid mode not
#   supported, drop all controllers from cgroupv2"): use runc when it is installed.
set -euo pipefail

args=()
cap_eff="$(awk '/^CapEff:/ {print $2}' /proc/self/status)"
if (( (16#$cap_eff >> 24 & 1) == 0 )); then   # bit 24 = CAP_SYS_RESOURCE
    nofile="$(ulimit -Hn)"
    args+=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=32768:32768")
fi
if [[ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" == tmpfs ]] \
        && [[ "$(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null)" == cgroup2fs ]] \
        && command -v runc >/dev/null; then
    args+=(--runtime runc)
fi
echo "${args[*]}"
