# One image for the operator (`agentrun operator`) and the lap runner (`agentrun lap`).
# NOTE: not built in CI (the build machines have no container engine); the e2e suite runs the
# same commands as host processes. Build: docker build -t ghcr.io/agentrun/agentrun:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# Non-root, numeric UID so runAsNonRoot can verify it; works with readOnlyRootFilesystem
# (nothing is written outside /tmp, which the chart mounts as an emptyDir).
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin agentrun
USER 65532:65532
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["agentrun"]
CMD ["operator"]
