#!/usr/bin/env bash
# On the GPU machine (device tool): install the carried wheels and redis, then run
# bench/e2e_gpu.py with the given arguments; results and logs land in $OUT.
#   carry: [".whl", ".redis"]   command: bash bench/gpu/run_e2e.sh --gpus 1 ...
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if ls .redis/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/redis && for f in .redis/*.deb; do dpkg -x "$f" /tmp/redis; done
    export PATH=/tmp/redis/usr/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 bench/e2e_gpu.py --out "${OUT:-/tmp}/e2e_gpu.json" --logs "${OUT:-/tmp}" "$@"
