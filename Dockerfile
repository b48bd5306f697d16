# chatrun serve in a container (docs/deploy.md, "In a container").
#   docker build -t chatrun .
#   docker run --rm -p 8000:8000 -e OPENAI_API_KEY chatrun          # the example bot `hello`
#   docker run --rm -p 8000:8000 -e OPENAI_API_KEY -v "$PWD/bots:/bots:ro" chatrun /bots/travel
# The image holds the wheel built from this checkout with the `serve`, `redis`, `postgres` and
# `metrics` extras; bots are mounted at /bots; a SQLite store lives in the volume /data unless
# CHATRUN_STORE names another (compose.yaml runs it on Redis or PostgreSQL).

# Python 3.11 on Debian 12, slim. Pin a digest (python:3.11-slim-bookworm@sha256:...) to rebuild
# byte for byte; the tag alone takes the security fixes of each rebuild.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- 1. build the wheel (the same `pip wheel` tests/test_container.py runs) ----------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runner/chatrun runner/chatrun
COPY schemas schemas
COPY bots bots
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# -- 2. the image: the wheel installed, nothing else of the checkout -----------------------------
FROM ${PYTHON_IMAGE}

# DL3064 takes the TOKEN in TIKTOKEN_CACHE_DIR (a folder of public encodings, no secret) for one.
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken \
    CHATRUN_STORE=sqlite:////data/chatrun.db

# The server never runs as root: a system user of its own, owning only /data.
RUN groupadd --system --gid 10001 chatrun \
 && useradd --system --uid 10001 --gid chatrun --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin chatrun \
 && mkdir -p /data /bots /opt/tiktoken \
 && chown chatrun:chatrun /data

COPY --from=build /dist/ /tmp/dist/
# One layer: install the wheel with its extras, fetch the token encodings the memory counts with
# (docs/memory.md: offline at run time), copy the example bot `hello` as the default bot.
RUN set -eu; \
    wheel="$(echo /tmp/dist/chatrun-*.whl)"; \
    pip install --no-cache-dir "chatrun[serve,redis,postgres,metrics] @ file://${wheel}"; \
    rm -rf /tmp/dist; \
    python -c "import tiktoken; [tiktoken.get_encoding(n) for n in ('o200k_base', 'cl100k_base')]"; \
    chatrun init --example hello /bots/hello

# Numeric, so a runtime can check it is not root (Kubernetes' runAsNonRoot).
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000

# Liveness: /health answers 200 while the process serves (also while the store is down: then its
# `status` is "degraded"), 503 while draining. Readiness is /ready (compose.yaml's healthcheck,
# a Kubernetes readinessProbe). The slim image has no curl: Python's own client asks.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]

# SIGTERM drains (finishes the turns in flight within --drain-timeout, then exits): Docker's
# default 10 s stop grace is shorter than the 30 s default drain; compose.yaml sets 40 s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["chatrun", "serve", "--host", "0.0.0.0", "--port", "8000"]
# The bots to serve (one or more folders under /bots) and any further `chatrun serve` option.
CMD ["/bots/hello"]
