# reposerve on the bundled model repository.
#   docker build -t reposerve .                                   # CPU
#   docker build -t reposerve:cuda --build-arg BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 .
ARG BASE=python:3.11-slim
FROM ${BASE}
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /opt/reposerve
COPY pyproject.toml README.md ./
COPY reposerve ./reposerve
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir '.'
COPY model_repository ./model_repository
ENV PATH=/opt/venv/bin:$PATH
EXPOSE 8000
ENTRYPOINT ["reposerve"]
CMD ["--model-repository", "/opt/reposerve/model_repository", "--http-port", "8000"]
