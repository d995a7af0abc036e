# reposerve on the bundled model repository.
#   docker build -t reposerve .                                    # CPU
#   docker build -t reposerve:cuda \
#     --build-arg BASE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04 .   # CUDA variant
#   docker run -p 8000:8000 reposerve
# EXTRAS picks the backends (default: onnx and torch, which the ResNet examples need) and
# gpu (nvidia-ml-py, for the nv_gpu_* metrics; harmless without a GPU).
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG EXTRAS=onnx,torch,gpu
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /opt/reposerve
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md ./
COPY reposerve ./reposerve
RUN pip install --no-cache-dir ".[${EXTRAS}]"
COPY model_repository ./model_repository
COPY tools/export_examples.py ./tools/export_examples.py
# The ResNet-50 examples are exported here (weights=None: nothing is downloaded).
RUN python tools/export_examples.py --repository model_repository
EXPOSE 8000
ENTRYPOINT ["reposerve"]
CMD ["--model-repository", "/opt/reposerve/model_repository", "--http-port", "8000"]
