#!/usr/bin/env bash
# Gather what the service needs on a GPU machine that has no network: Python 3.12 wheels
# of tctune's dependencies that its image lacks (into .whl/), and Debian's redis-server
# with its libraries (into .redis/). Both folders are git-ignored; name them in the
# device tool's `carry`. Run from the repository root.
set -euo pipefail
grep -qxF '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qxF '/.redis/' .git/info/exclude || echo '/.redis/' >> .git/info/exclude
rm -rf .whl .redis && mkdir -p .whl .redis
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl \
    fastapi uvicorn sqlalchemy alembic pydantic pydantic-settings celery redis xgboost-cpu \
    httpx rich click prometheus-client plotly cuda-bindings cuda-pathfinder
# The GPU image has these already (PyTorch's environment); two versions would clash.
rm -f .whl/numpy-* .whl/scipy-* .whl/typing_extensions-* .whl/packaging-*
(cd .redis && apt-get download -q redis-server redis-tools libjemalloc2 liblzf1 2>/dev/null)
du -sh .whl .redis
