# reposerve, serving the model repository at /mnt/models (KServe's mount point), as a
# non-root user, on 8000 (HTTP), 8001 (gRPC) and 8002 (metrics).
#   docker build -t reposerve:0.1.0 .                                # CPU
#   docker build -t reposerve:0.1.0-cuda \
#     --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 .   # CUDA
#   docker run -p 8000:8000 -p 8001:8001 -p 8002:8002 reposerve:0.1.0
#   docker run -v $PWD/my_models:/mnt/models ... reposerve:0.1.0       # your repository
# EXTRAS picks the backends (default: onnx and torch, which the bundled examples need) and
# gpu (nvidia-ml-py, for the nv_gpu_* metrics; harmless without a GPU). The image holds the
# bundled repository with its ResNet-50 examples exported (weights=None: nothing is
# downloaded); a volume on /mnt/models replaces it.
#
# Stages, so that a change to reposerve's code rebuilds only its wheel and the last layers
# (the engine's layer cache keeps the rest; buildah and podman need --layers):
#   deps    the dependencies, from pyproject.toml alone (the slow, 6 GB part)
#   models  the bundled repository with its examples exported (deps' torch and onnx)
#   app     reposerve's wheel, from its source
#   (run)   deps' environment, the models, the wheel installed without an index
ARG BASE=python:3.11-slim

# -- deps: a virtual environment with reposerve's dependencies, not reposerve ----------------
FROM ${BASE} AS deps
ARG EXTRAS=onnx,torch,gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The CUDA bases have no Python: the distribution's (no compiler: every wheel is binary).
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Where pip looks (a mirror; torch's CPU index https://download.pytorch.org/whl/cpu, whose
# +cpu torch and torchvision pip then prefers, without PyPI's 3 GB of CUDA libraries; a
# folder of wheels mounted into the build; the CA a proxy signs with): build arguments, so
# they stay in the build stages, out of the image.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
COPY pyproject.toml /tmp/deps/pyproject.toml
# pyproject.toml bounds every dependency. pip resolves them through the project itself, so
# a stub of it (the version its metadata reads, the readme it names) stands in for the
# source, keeping this layer cached across code changes. The stub is uninstalled and its
# folder removed: setuptools' build/ there would outlive it in the stages built from this one.
# hadolint ignore=DL3013
RUN mkdir /tmp/deps/reposerve \
    && echo '__version__ = "0"' > /tmp/deps/reposerve/__init__.py \
    && touch /tmp/deps/README.md \
    && pip install "/tmp/deps[${EXTRAS}]" \
    && pip uninstall --yes reposerve \
    && rm -rf /tmp/deps
WORKDIR /src

# -- models: the bundled repository, its ResNet-50 examples exported ------------------------
FROM deps AS models
COPY model_repository /mnt/models
COPY tools/export_examples.py ./tools/export_examples.py
RUN python tools/export_examples.py --repository /mnt/models

# -- app: reposerve's wheel ------------------------------------------------------------------
FROM deps AS app
# pip fetches the build backend (setuptools) for the wheel: the same sources as deps
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
COPY pyproject.toml README.md ./
COPY reposerve ./reposerve
RUN pip wheel --no-deps --wheel-dir /wheels .

# -- run: the environment, the repository and reposerve, nothing used to build them ---------
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid 1000 --user-group reposerve
# the two large layers first: the cache reuses them while pyproject.toml and the
# repository are unchanged
COPY --from=deps /opt/venv /opt/venv
COPY --from=models --chown=reposerve:reposerve /mnt/models /mnt/models
COPY --from=app /wheels /wheels
# every dependency is in the environment already: no index is needed, none is reachable
# hadolint ignore=DL3013
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-index /wheels/*.whl \
    && rm -rf /wheels
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 REPOSERVE_CACHE_DIR=/home/reposerve/.cache/reposerve
USER 1000:1000
WORKDIR /home/reposerve
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
ENTRYPOINT ["reposerve"]
CMD ["--model-repository", "/mnt/models", "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002"]
