#!/usr/bin/env bash
# On the GPU machine (device tool): the service tunes ResNet-50 at batch 8 (both precisions,
# TRIALS a layer on average, bench/gpu/tune_model.sh), then its schedules and every reference
# records file are retimed in turn (bench.retime), twice, and each layer's service time is
# taken over its fastest reference's (python -m bench.service_tuning versus). Results land in
# $OUT as one archive, all<TRIALS>.tgz.
#   carry: [".whl", CACHE] with CACHE the references' builds (`python -m bench.retime
#   prebuild --records R --cache CACHE --models resnet50 --batches 8 --target T` on a CPU)
#   command: bash bench/gpu/tune_model_versus.sh TRIALS CACHE TARGET R1[@MEASURED_ON] R2 ...
#   e.g.     bash bench/gpu/tune_model_versus.sh 128 .run/rt h200 \
#                bench/data/model_e2e_records_h100.json@h100 .run/search_h200.json
set -uo pipefail
trials=$1; cache=$2; target=$3; shift 3
out=${OUT:-/tmp/tune_model_versus}; mkdir -p "$out"
. bench/gpu/wheels.sh
run="$out/s$trials"; mkdir -p "$run"
TARGET=$target E2E=0 OUT=$run bash bench/gpu/tune_model.sh torchvision:resnet50 "$trials" \
    8,3,224,224 | tail -n 1
python3 -m bench.service_tuning summarize "$run" --out "$out/summary$trials.json"
python3 -m bench.service_tuning records "$out/summary$trials.json" --out "$out/records$trials.json"
layers=(--cache "$cache" --models resnet50 --batches 8)
service=""; declare -a refs
for pass in 1 2; do
    f="$out/retime_service_$pass.json"
    python3 -m bench.retime run --records "$out/records$trials.json" "${layers[@]}" --out "$f" \
        > /dev/null 2>&1
    service="$service${service:+,}$f"
    i=0
    for ref in "$@"; do
        path=${ref%@*}; on=()
        [ "$path" != "$ref" ] && on=(--records-target "${ref#*@}")
        f="$out/retime_ref${i}_$pass.json"
        python3 -m bench.retime run --records "$path" "${on[@]}" "${layers[@]}" --out "$f" \
            > /dev/null 2>&1
        refs[i]="${refs[i]:-}${refs[i]:+,}$f"; i=$((i + 1))
    done
done
args=(); for r in "${refs[@]}"; do args+=(--reference "$r"); done
python3 -m bench.service_tuning versus --service "$service" "${args[@]}" \
    --out "$out/versus$trials.json"
# One file back from the device (it returns at most 8): the archive, written outside $out.
tar czf "/tmp/all$trials.tgz" -C "$out" . && rm -rf "${out:?}"/* && mv "/tmp/all$trials.tgz" "$out/"
