#!/usr/bin/env bash
# Make sure a Docker engine answers, for the docker executor and `doit image`.
#
#   scripts/docker_engine.sh [--pid-file FILE] [--log FILE]
#
# - docker and debootstrap missing: installs Debian's docker.io and debootstrap (needs root and
#   Debian's package mirror).
# - an engine already answers (`docker info`): nothing else to do.
# - otherwise starts dockerd in the background (root), logging to --log, and waits until it
#   answers. Where overlayfs does not work (some sandboxes), it retries with the vfs storage
#   driver, then without iptables/bridge networking (the build steps need no network).
# Prints the PID of a dockerd it started to --pid-file (so the caller can stop that one).
set -euo pipefail

PID_FILE=""
LOG="/var/tmp/hexbundle-dockerd.log"
while [ $# -gt 0 ]; do
    case "$1" in
        --pid-file) PID_FILE="$2"; shift 2 ;;
        --log) LOG="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "docker_engine: unknown option $1" >&2; exit 2 ;;
    esac
done

need_install=""
command -v dockerd >/dev/null || need_install="$need_install docker.io"
command -v docker >/dev/null || need_install="$need_install docker.io"
command -v debootstrap >/dev/null || need_install="$need_install debootstrap"
if [ -n "$need_install" ]; then
    echo "== installing:$need_install"
    [ "$(id -u)" = 0 ] || { echo "docker_engine: root is needed to install$need_install" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap > /dev/null
fi

if docker info >/dev/null 2>&1; then
    echo "== a Docker engine answers: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "docker_engine: no engine answers, and starting dockerd needs root \
(or set DOCKER_HOST to an engine you can reach)" >&2; exit 1; }

wait_for_engine() {   # pid seconds
    local i
    for i in $(seq 1 "$2"); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 "$1" 2>/dev/null || return 1      # dockerd exited
        sleep 1
    done
    return 1
}

for options in "" "--storage-driver=vfs" "--storage-driver=vfs --iptables=false --bridge=none"; do
    echo "== starting dockerd $options (log: $LOG)"
    # setsid + no inherited stdio: the engine outlives this script without holding its output.
    # shellcheck disable=SC2086
    setsid dockerd $options < /dev/null >> "$LOG" 2>&1 &
    pid=$!
    if wait_for_engine "$pid" 60; then
        [ -z "$PID_FILE" ] || echo "$pid" > "$PID_FILE"
        driver="$(docker info --format '{{.Driver}}')"
        echo "== dockerd $pid answers (storage driver: $driver)"
        if [ -n "$options" ]; then
            # Each storage driver keeps its own images: the ones made under the first driver are
            # still on disk, but this engine does not see them. Say so, loudly.
            cat >&2 <<EOM
docker_engine: WARNING: dockerd came up only with '$options' (storage driver $driver),
docker_engine: WARNING: not with its default driver (see $LOG). Images made under another
docker_engine: WARNING: driver are NOT visible to this engine (they are not lost): build them
docker_engine: WARNING: again (scripts/make_base_image.sh, then \`doit image\`), or fix the default
docker_engine: WARNING: driver and restart dockerd to see them again.
EOM
        fi
        exit 0
    fi
    echo "   dockerd $options did not come up; last log lines:" >&2
    tail -n 5 "$LOG" >&2 || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f /var/run/docker.pid
done
echo "docker_engine: could not start a Docker engine (see $LOG)" >&2
exit 1
