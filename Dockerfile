# One image for the operator (`agentrun operator`) and the lap runner (`agentrun lap`).
#
# `make image` builds this image WITHOUT a container engine (tools/image/build.sh: mmdebstrap +
# buildah, an oci-archive in build/image/). This Dockerfile is for people with Docker and follows
# the same steps:
#   1. Debian bookworm with the Debian packages of tools/image/packages.txt (Debian's python3,
#      ca-certificates; no compilers), user and group 65532 (agentrun);
#   2. the project wheel and the pinned wheels of tools/image/requirements.txt, wheels only
#      (--only-binary :all:), installed into the virtualenv /opt/agentrun by pip run from its own
#      wheel (no pip left in the image), then `pip check`; the kubernetes client's asyncio copy
#      (kubernetes/aio, ~68 MB, imported by nothing here) is removed;
#   3. USER 65532:65532, ENTRYPOINT ["agentrun"], CMD ["operator"].
# Where they differ: the base here is the debian:bookworm-slim image (it also has apt and a few
# packages more than mmdebstrap's `essential` variant), and the project wheel is built in a build
# stage instead of on the host. tests/image/test_image_build.py checks that both install the same
# Debian packages, the same Python packages and the same user/entrypoint.
#
# Build: docker build -t ghcr.io/agentrun/agentrun:0.1.0 .   (needs BuildKit for RUN --mount)
FROM python:3.11-slim-bookworm AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY tools/image/requirements.txt /wheels/requirements.txt
RUN pip wheel --no-cache-dir --no-deps -w /wheels . \
 && pip download --no-cache-dir --only-binary :all: --no-deps -d /wheels -r /wheels/requirements.txt pip==24.2

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && echo "agentrun:x:65532:65532:agentrun:/nonexistent:/usr/sbin/nologin" >> /etc/passwd \
 && echo "agentrun:x:65532:" >> /etc/group
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    python3 -m venv --without-pip /opt/agentrun \
 && /opt/agentrun/bin/python /wheels/pip-24.2-py3-none-any.whl/pip install --no-cache-dir --no-index \
      --find-links /wheels --only-binary :all: --no-deps -r /wheels/requirements.txt /wheels/agentrun-*.whl \
 && /opt/agentrun/bin/python /wheels/pip-24.2-py3-none-any.whl/pip check \
 && rm -rf /opt/agentrun/lib/python3.11/site-packages/kubernetes/aio
ENV PATH=/opt/agentrun/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /
# Non-root, numeric UID so runAsNonRoot can verify it; works with readOnlyRootFilesystem
# (nothing is written outside /tmp, which the chart and the lap Jobs mount as an emptyDir).
USER 65532:65532
ENTRYPOINT ["agentrun"]
CMD ["operator"]
