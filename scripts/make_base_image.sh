#!/usr/bin/env bash
# Make the toolchain image's base locally, with no image registry: a minimal Debian rootfs from
# Debian's package mirror (debootstrap), plus a CPython 3.10, imported into Docker under a fixed
# tag. For air-gapped sites and for CI here, where no registry is reachable; a site that can pull
# keeps the Dockerfile's pinned ubuntu:22.04 base instead.
#
#   scripts/make_base_image.sh [--tag TAG] [--suite SUITE] [--mirror URL] [--python DIR]
#                              [--id-file FILE] [--force]
#
# The base is Debian, not Ubuntu 22.04, and Debian bookworm only packages Python 3.11: the
# QAIRT 2.42 Python API wants 3.10, so a CPython 3.10 prefix (default: pyenv's 3.10.13 when
# present) is copied to /opt/python3.10. The image's labels say both things.
#
# Cached: when TAG exists and carries this recipe's digest (this script + its options), nothing
# is rebuilt. Any edit of this script, or other options, makes a new base.
# Needs: root, debootstrap, docker (a running engine). Prints and records the image ID.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
TAG="hexbundle/base:bookworm-py3.10"
SUITE="bookworm"
MIRROR=""
PYTHON_DIR="/root/.pyenv/versions/3.10.13"
ID_FILE="$ROOT/build/image/base-image-id.txt"
FORCE=0

die() { echo "make_base_image: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG="$2"; shift 2 ;;
        --suite) SUITE="$2"; shift 2 ;;
        --mirror) MIRROR="$2"; shift 2 ;;
        --python) PYTHON_DIR="$2"; shift 2 ;;
        --id-file) ID_FILE="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

# The Debian mirror this host's apt uses (deb822 .sources or one-line .list), unless given.
host_mirror() {
    local uri
    uri="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
            /etc/apt/sources.list.d/*.list 2>/dev/null \
          | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
          | awk '{print $1}' | grep -E '/debian/?$' | head -n1 || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}
[ -n "$MIRROR" ] || MIRROR="$(host_mirror)"

[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root (CI runs as root)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed); start dockerd \
or set DOCKER_HOST"
[ -x "$PYTHON_DIR/bin/python3.10" ] || die "no CPython 3.10 at $PYTHON_DIR (want \
$PYTHON_DIR/bin/python3.10); pass --python DIR, the prefix of a CPython 3.10 built for this \
glibc (e.g. pyenv install 3.10.13)"

PY_VERSION="$("$PYTHON_DIR/bin/python3.10" -c 'import platform; print(platform.python_version())')"
# The recipe: the script's bytes and every option that changes the result.
RECIPE="$( { cat "$0"; echo "suite=$SUITE mirror=$MIRROR python=$PYTHON_DIR $PY_VERSION"; } \
          | sha256sum | cut -d' ' -f1)"

existing_recipe() {
    docker image inspect --format '{{ index .Config.Labels "org.hexbundle.base.recipe-sha256" }}' \
        "$TAG" 2>/dev/null || true
}

record_id() {
    local id tmp
    id="$(docker image inspect --format '{{.Id}}' "$TAG")"
    mkdir -p "$(dirname "$ID_FILE")"
    # hexbundle's one temp-name scheme (hexbundle/support/atomic.py): the next run sweeps it
    tmp="$(dirname "$ID_FILE")/.$(basename "$ID_FILE").$$.$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n').tmp"
    echo "$id" > "$tmp" && mv "$tmp" "$ID_FILE"
    echo "base image $TAG = $id (recorded in $ID_FILE)"
}

if [ "$FORCE" = 0 ] && [ "$(existing_recipe)" = "$RECIPE" ]; then
    echo "base image $TAG is up to date (recipe $RECIPE)"
    record_id
    exit 0
fi

# Shared libraries the copied CPython's extension modules link against (ssl, ctypes, sqlite3,
# bz2, lzma, readline, curses, uuid, expat, nis); minbase lacks most of them.
LIBS="libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libreadline8,libncursesw6"
LIBS="$LIBS,libuuid1,libexpat1,libtirpc3,libnsl2"

WORK="$(mktemp -d /var/tmp/hexbundle-base.XXXXXX)"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
ROOTFS="$WORK/rootfs"
started=$(date +%s)

echo "== debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase --include="$LIBS" "$SUITE" "$ROOTFS" "$MIRROR" \
    > "$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2;
    die "debootstrap failed (full log above was $WORK/debootstrap.log)"; }

echo "== CPython $PY_VERSION from $PYTHON_DIR -> /opt/python3.10"
# The interpreter, its shared library and the standard library; not the host's site-packages
# (it holds whatever was installed there, even sandbox hooks), not the test suite, not the
# scripts whose #! lines name the host prefix, not the static libpython (no extension is built
# here). pip comes from the stdlib's ensurepip wheel.
mkdir -p "$ROOTFS/opt/python3.10/bin" "$ROOTFS/opt/python3.10/lib"
cp -a "$PYTHON_DIR/bin/python3.10" "$ROOTFS/opt/python3.10/bin/"
cp -a "$PYTHON_DIR"/lib/libpython3* "$ROOTFS/opt/python3.10/lib/"
tar -C "$PYTHON_DIR/lib" --exclude='python3.10/site-packages/*' --exclude='python3.10/test' \
    --exclude='python3.10/idlelib' --exclude='python3.10/tkinter' \
    --exclude='python3.10/turtledemo' --exclude='python3.10/config-3.10-*' \
    --exclude='__pycache__' -cf - python3.10 | tar -C "$ROOTFS/opt/python3.10/lib" -xf -
ln -s python3.10 "$ROOTFS/opt/python3.10/bin/python3"
# The binary's RUNPATH names the host prefix: tell the loader where libpython now lives.
echo /opt/python3.10/lib > "$ROOTFS/etc/ld.so.conf.d/python3.10.conf"
chroot "$ROOTFS" /sbin/ldconfig
for name in python3 python3.10 python; do
    ln -s /opt/python3.10/bin/python3.10 "$ROOTFS/usr/local/bin/$name"
done
chroot "$ROOTFS" /usr/local/bin/python3 -m ensurepip --default-pip > "$WORK/ensurepip.log" 2>&1 \
    || { cat "$WORK/ensurepip.log" >&2; die "ensurepip failed in the new rootfs"; }
rm -f "$ROOTFS"/opt/python3.10/bin/pip* 2>/dev/null || true   # #! lines; use python3 -m pip
chroot "$ROOTFS" /usr/local/bin/python3 -c 'import ssl, ctypes, sqlite3, bz2, lzma, uuid, zlib' \
    || die "the copied CPython cannot load its extension modules in the new rootfs"

echo "== trim caches and logs"
rm -rf "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/* "$ROOTFS"/tmp/* \
       "$ROOTFS"/var/cache/ldconfig/aux-cache "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/*
find "$ROOTFS/usr/share/doc" -type f ! -name copyright -delete   # keep the licenses
: > "$ROOTFS/etc/machine-id" 2>/dev/null || true
# apt inside the image uses the same mirror (not needed by the build: it installs nothing).
echo "deb $MIRROR $SUITE main" > "$ROOTFS/etc/apt/sources.list"

echo "== docker import -> $TAG"
DEBIAN_VERSION="$(cat "$ROOTFS/etc/debian_version")"
tar -C "$ROOTFS" --sort=name --numeric-owner --pax-option=delete=atime,delete=ctime -cf - . \
  | docker import \
      --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["/usr/local/bin/python3"]' \
      --change "LABEL org.hexbundle.base.os=\"Debian $DEBIAN_VERSION ($SUITE), NOT Ubuntu 22.04\"" \
      --change "LABEL org.hexbundle.base.debian-mirror=\"$MIRROR\"" \
      --change "LABEL org.hexbundle.base.python=\"CPython $PY_VERSION copied from $PYTHON_DIR to /opt/python3.10 (Debian $SUITE packages only Python 3.11)\"" \
      --change "LABEL org.hexbundle.base.recipe-sha256=\"$RECIPE\"" \
      --change "LABEL org.hexbundle.base.made-by=\"scripts/make_base_image.sh\"" \
      - "$TAG" > /dev/null

echo "made $TAG in $(( $(date +%s) - started ))s, $(docker image inspect --format '{{.Size}}' "$TAG") bytes"
record_id
