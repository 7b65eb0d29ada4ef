# The hexbundle toolchain image: CPython 3.10, the hashed Python lock, QAIRT (when staged).
#
# Built by `doit image` (hexbundle/toolchain/image.py), which assembles the build context
# itself: this file, requirements/container.lock, the locked wheels (wheelhouse/) and sdk/ (the
# installer, plus the SDK archive once its sha256 matched the pin). build/ and the project's
# sources never enter it: the sources are mounted read-only when a step runs. Nothing here
# reaches a network, except the Python step on a base that lacks python3.10 (see below).

# Pinned by digest; a site that mirrors its own base passes --build-arg BASE=<its reference>
# (`doit image --base ...`), e.g. the Debian base made by scripts/make_base_image.sh.
ARG BASE=ubuntu:22.04@sha256:0bced47fffa3361afa981854fcabcd4577cd43cebbb808cea2b1f33a3dd7f508

# ---- Python 3.10 and the locked wheels, installed under /deps (copied into the final image, so
# the wheelhouse itself does not stay in any layer)
FROM ${BASE} AS python-deps
# Ubuntu 22.04's image has no Python at all: its python3.10 comes from Ubuntu's packages, which
# needs a network (`doit image --network default`). A local base brings its own python3.10.
RUN if ! command -v python3.10 >/dev/null 2>&1; then \
        echo "base image has no python3.10: installing Ubuntu's (needs a network)"; \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
            --no-install-recommends python3.10 python3-pip && rm -rf /var/lib/apt/lists/* \
        || { echo "ERROR: no python3.10 in the base and no network to install it: build" \
             "with --network default, or on a base made by scripts/make_base_image.sh"; exit 1; }; \
    fi
COPY requirements/container.lock /tmp/hexbundle/container.lock
COPY wheelhouse/ /tmp/hexbundle/wheelhouse/
RUN python3.10 -m pip install --no-index --find-links /tmp/hexbundle/wheelhouse \
        --require-hashes --no-cache-dir --disable-pip-version-check --root /deps \
        -r /tmp/hexbundle/container.lock

# ---- the QAIRT SDK, unpacked under /sdk (empty when no archive was staged)
FROM ${BASE} AS sdk
ARG SDK_VERSION=none
ARG SDK_SHA256=none
ARG SDK_ARCHIVE=none
ARG SDK_INSTALL_DIR=none
COPY sdk/ /tmp/sdk/
RUN python3.10 /tmp/sdk/install_sdk.py --version "$SDK_VERSION" --sha256 "$SDK_SHA256" \
        --archive "$SDK_ARCHIVE" --install-dir "$SDK_INSTALL_DIR" --dest /sdk

# ---- the toolchain image
FROM ${BASE}
ARG IMAGE_USER=hexbundle
# Empty when the image carries no SDK (its hexbundle.sdk label then says "none").
ARG SDK_ROOT=""
ARG SDK_PYTHONPATH=""
ARG SDK_LIBRARY_PATH=""
ARG SDK_PATH_PREFIX=""
RUN if command -v python3.10 >/dev/null 2>&1; then :; else \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
            --no-install-recommends python3.10 && rm -rf /var/lib/apt/lists/*; fi \
    && (getent group 1000 >/dev/null || groupadd --gid 1000 "$IMAGE_USER") \
    && (getent passwd 1000 >/dev/null \
        || useradd --uid 1000 --gid 1000 --create-home --shell /bin/sh "$IMAGE_USER")
COPY --from=python-deps /deps/ /
COPY --from=sdk /sdk/ /
# As the SDK's envsetup.sh sets them: the root under both names, its Python API, libs and tools.
ENV QAIRT_SDK_ROOT=${SDK_ROOT} \
    QNN_SDK_ROOT=${SDK_ROOT} \
    PYTHONPATH=${SDK_PYTHONPATH} \
    LD_LIBRARY_PATH=${SDK_LIBRARY_PATH} \
    PATH=${SDK_PATH_PREFIX}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1
# The standard library's bytecode, compiled once here: a step runs in a fresh container with
# PYTHONDONTWRITEBYTECODE, so without it every step compiled the modules it imports again
# (~0.25 s of each step's start: numpy, onnx, tokenizers, xxhash and tomli imported in 0.44 s,
# 0.20 s with these). unchecked-hash: no source timestamps in the pycs, and the image's stdlib
# never changes under them. The test suites in it are left out (some are not valid Python 3).
RUN python3.10 -m compileall -q -x "/(test|tests|idle_test)/" --invalidation-mode unchecked-hash \
        "$(python3.10 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
# Fail the build now, not the first compile, if the Python stack cannot import.
RUN python3.10 -c "import numpy, onnx, tomli, xxhash, doit, pydantic, yaml, jsonschema"
# Not root (by number: a site's base may already have a uid 1000 under another name). Build steps
# run as the host's uid:gid instead, so that their outputs belong to the host user.
USER 1000:1000
WORKDIR /tmp
CMD ["python3.10"]
