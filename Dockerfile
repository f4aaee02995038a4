# The apportion operator image: `docker build -t apportion .`
# Builder: turn the package and its dependencies into wheels (all have manylinux wheels, so no
# compiler is needed). Final: install the wheels offline into a slim image, run as non-root.

FROM python:3.11-slim AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=builder /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links=/tmp/wheels apportion \
    && rm -rf /tmp/wheels \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin apportion
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["apportion", "operator"]
CMD ["--all-namespaces"]
