# The apportion image (operator and worker): `docker build -t apportion .`
# BASE is any Debian-family image with python3 (>= 3.11) and the venv module: the official slim
# image by default; `make image` builds from a local Debian base where that cannot be pulled.
# Everything goes into a virtual environment (/opt/apportion), which works on any such base and
# never touches the base's interpreter (Debian's refuses pip installs, PEP 668).
ARG BASE=python:3.11-slim

FROM ${BASE} AS builder
# A compiler and libxxhash-dev (the header it compiles in) for the native key kernel; Python.h from python3-dev only where the
# base's interpreter lacks its headers (Debian's python3 does, the official image does not).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libxxhash-dev \
    && if ! python3 -c 'import pathlib, sys, sysconfig; sys.exit(not pathlib.Path(sysconfig.get_path("include"), "Python.h").exists())'; then \
         apt-get install -y --no-install-recommends python3-dev; fi \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/apportion
# The pip extras installed: the operator's by default; the dev-cluster's real node adds
# `postgres` (psycopg) for the demo workers' fenced writes, which the product image never makes.
ARG EXTRAS=operator
# Set (to anything) by the dev-cluster's real node only: the harness and demo of devtools/ go
# into its image beside the product; the product image never holds them.
ARG DEVTOOLS=
# The third-party requirements first, read from the pyproject files alone: a layer that a source
# change (every release, every `make image`) reuses instead of downloading them again. A build
# behind a TLS-intercepting proxy passes its CA bundle as the secret `ca-bundle`; it is mounted
# for the pip steps only and never lands in a layer.
COPY pyproject.toml scripts/image_requirements.py /src/
COPY devtools/pyproject.toml /src/devtools/
RUN --mount=type=secret,id=ca-bundle \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 /src/image_requirements.py /src/pyproject.toml "${EXTRAS}" ${DEVTOOLS:+/src/devtools/pyproject.toml} > /src/requirements.txt \
    && /opt/apportion/bin/pip install --no-cache-dir --disable-pip-version-check -r /src/requirements.txt
# VERSION: both distributions read their version from it (devtools/VERSION links to it).
COPY README.md VERSION /src/
COPY operator /src/operator
COPY devtools /src/devtools
# `pip check` fails the build if the layer above missed a requirement the sources declare.
RUN --mount=type=secret,id=ca-bundle \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && /opt/apportion/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation "/src[${EXTRAS}]" ${DEVTOOLS:+/src/devtools} \
    && /opt/apportion/bin/pip check \
    && /opt/apportion/bin/pip uninstall --yes --quiet pip setuptools wheel \
    && rm -rf /src

FROM ${BASE}
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin apportion
COPY --from=builder /opt/apportion /opt/apportion
# Read-only root filesystem: nothing writes .pyc files at run time (pip compiled them).
ENV PATH=/opt/apportion/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["apportion"]
CMD ["operator", "--all-namespaces"]
