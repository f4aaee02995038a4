# The apportion operator image: `docker build -t apportion .`
# Builder: turn the package and its dependencies into wheels (the dependencies have manylinux
# wheels; the compiler and libxxhash-dev are for our native key kernel). Final: install the
# wheels offline into a slim image with the runtime libxxhash, run as non-root.

FROM python:3.11-slim AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libxxhash-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[operator]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends libxxhash0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links=/tmp/wheels 'apportion[operator]' \
    && rm -rf /tmp/wheels \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin apportion
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["apportion", "operator"]
CMD ["--all-namespaces"]
