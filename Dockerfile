# One image for every tctune process; the GPU worker adds CuPy on a CUDA runtime base.
# Build: docker build -t tctune .            (api, explorer, builder)
#        docker build -t tctune-gpu --target gpu .   (worker-gpu)

FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api api
COPY workers workers
COPY kernels kernels
COPY search search
COPY store store
COPY migrations migrations
RUN pip install .
EXPOSE 8000
CMD ["tctune", "serve", "--host", "0.0.0.0", "--port", "8000"]

# GPU workers: the host's driver comes in through the NVIDIA container runtime; the CUDA
# runtime matches NVRTC's 13.0 pin.
FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04 AS gpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=base /app /app
RUN pip install ".[gpu]"
CMD ["tctune", "worker", "--gpu", "0"]
