#!/usr/bin/env bash
# On the GPU machine (device tool): the embedded service (SQLite, the cuda backend) tunes
# every distinct conv of a model in both precisions from an empty database (`tctune plan
# --wait`, the two plans at once), timed from the first submission to the last job's end;
# then bench/model_e2e.py runs the model on the service's schedules. Results land in $OUT.
#   carry: [".whl"] (and a kernel cache for model_e2e, e.g. ".run")
#   command: bash bench/gpu/tune_model.sh [MODEL] [TRIALS] [N,C,H,W] [E2E_CACHE]
#   e.g.     bash bench/gpu/tune_model.sh torchvision:resnet50 32 8,3,224,224 .run/e2e_cache
#   (VARIANTS=compiled runs the model only compiled with PDL, as bench/model_e2e.py's --variants;
#   TARGET=h200 on an H200; E2E=0 skips the model's run; TCTUNE_BUILD_PROCESSES sets the
#   service's build processes; the service measures on every GPU of the host's model;
#   CHOOSE=N then also runs tctune-deploy --choose-in-model N per precision: each record's
#   schedule chosen among its N runners-up in the service by timing the model; B2B=1 plans
#   the back-to-back layers too, `tctune plan --b2b`)
# Then, on any machine: python -m bench.service_tuning summarize $OUT --out F.
set -uo pipefail
out=${OUT:-/tmp/tune_model}; mkdir -p "$out"
model=${1:-torchvision:resnet50}; trials=${2:-32}; shape=${3:-8,3,224,224}
cache=${4:-/tmp/tctune-e2e-cache}; wait_s=${WAIT_S:-1800}
. bench/gpu/wheels.sh
export TCTUNE_AUTH=off
data=$(mktemp -d)
python3 -m api.cli serve --data "$data" --port 8000 > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 90); do curl -sf 127.0.0.1:8000/healthz > /dev/null && break; sleep 1; done
t0=$(date +%s.%N); pids=""
for p in int8 fp16; do
    python3 -m api.cli plan "$model" --input-shape "$shape" --precision $p --target "${TARGET:-h100}" \
        --trials "$trials" --wait --timeout "$wait_s" --server http://127.0.0.1:8000 \
        $([ "${B2B:-0}" = 1 ] && echo --b2b) \
        > "$out/plan_$p.json" 2> "$out/plan_$p.log" &
    pids="$pids $!"
done
wait $pids
python3 -c "import json, sys; from store.settings import Settings
json.dump({'model': sys.argv[1], 'trials': int(sys.argv[2]),
    'input_shape': sys.argv[3], 'tuning_wall_s': round(float(sys.argv[5]) - float(sys.argv[4]), 1),
    'build_processes': Settings().build_processes,
    'explore_processes': Settings().explore_processes,
    'measure_gpus': len(__import__('workers.local').local.measure_gpus(Settings())),
    'gpu': __import__('torch').cuda.get_device_name(0)}, open(sys.argv[6], 'w'))" \
    "$model" "$trials" "$shape" "$t0" "$(date +%s.%N)" "$out/tuning.json"
cat "$out/tuning.json"; echo
[ "${E2E:-1}" = 0 ] && exit 0
name=${model#torchvision:}
python3 -m bench.model_e2e run --cache "$cache" --schedules http://127.0.0.1:8000 \
    --models "$name" --batches "${shape%%,*}" --variants "${VARIANTS:-plain,pdl,compiled}" \
    --out "$out/e2e_service.json"
if [ "${CHOOSE:-0}" != 0 ]; then
    for p in int8 fp16; do
        python3 -m deploy "$model" --input-shape "$shape" --precision $p --target "${TARGET:-h100}" \
            --server http://127.0.0.1:8000 --choose-in-model "$CHOOSE" \
            > "$out/deploy_chosen_$p.json" 2> "$out/deploy_chosen_$p.log"
    done
fi
