#!/usr/bin/env bash
# On the GPU machine (device tool): install the carried wheels, redis and PostgreSQL, then
# run bench/e2e_gpu.py with the given arguments; results and logs land in $OUT.
#   carry: [".whl", ".redis", ".pg"]
#   command: bash bench/gpu/run_e2e.sh --gpus 2 --concurrent --trials 250
# Arguments are e2e_gpu.py's, plus:
#   --db sqlite|postgres  default postgres when distributed (--gpus > 1 or --distributed),
#                         else sqlite. postgres: a fresh PostgreSQL from .pg/ (see
#                         fetch_deps.sh), started here on a free port for this run only, as
#                         a non-root user (initdb refuses root), with fsync, synchronous
#                         commit and full page writes off: a throwaway benchmark database,
#                         not one to keep. Stopped and deleted at the end.
#   --tag NAME            names $OUT/NAME.json and $OUT/NAME_logs.tgz (default from the
#                         arguments, e.g. e2e_2gpu_distributed_postgres)
# Several runs can share one device call (the wheels install once), e.g. to compare:
#   bash bench/gpu/run_e2e.sh --gpus 2 --db sqlite ... ; bash bench/gpu/run_e2e.sh --gpus 2 ...
# Without a GPU (to test the service path): --simulate h200, with TCTUNE_E2E_WHEELS=0 where
# the dependencies are installed already.
set -uo pipefail
out=${OUT:-/tmp}
args=()
db="" tag="" gpus=1 dist=0 sim=""
while (($#)); do
    case $1 in
        --db) db=$2; shift 2; continue ;;
        --db=*) db=${1#--db=}; shift; continue ;;
        --tag) tag=$2; shift 2; continue ;;
        --tag=*) tag=${1#--tag=}; shift; continue ;;
        --gpus) gpus=$2 ;;
        --gpus=*) gpus=${1#--gpus=} ;;
        --distributed) dist=1 ;;
        --simulate) sim=$2 ;;
        --simulate=*) sim=${1#--simulate=} ;;
    esac
    args+=("$1"); shift
done
((gpus > 1)) && dist=1
[[ -n $db ]] || { ((dist)) && db=postgres || db=sqlite; }
case $db in sqlite | postgres) ;; *) echo "run_e2e: --db sqlite|postgres" >&2; exit 2 ;; esac
mode=embedded; ((dist)) && mode=distributed
tag=${tag:-e2e_${gpus}gpu_${mode}_${db}${sim:+_sim_$sim}}

# --- Python dependencies: the carried wheels, installed once per machine ------------------
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [[ -d .whl && ${TCTUNE_E2E_WHEELS:-1} != 0 ]]; then
    stamp=$(ls .whl | md5sum | cut -d' ' -f1)
    if [[ $(cat /tmp/site/.tctune-wheels 2>/dev/null) != "$stamp" ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
        echo "$stamp" > /tmp/site/.tctune-wheels
    fi
    export PYTHONPATH=/tmp/site:$PWD
fi

# --- redis ---------------------------------------------------------------------------------
if ls .redis/*.deb >/dev/null 2>&1; then
    [[ -x /tmp/redis/usr/bin/redis-server ]] ||
        { mkdir -p /tmp/redis && for f in .redis/*.deb; do dpkg -x "$f" /tmp/redis; done; }
    export PATH=/tmp/redis/usr/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi

# --- PostgreSQL ----------------------------------------------------------------------------
pgdir=""
pg_stop() {
    [[ -n $pgdir ]] || return 0
    pg_as "$pgbin/pg_ctl" -D "$pgdir/data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
        pg_as "$pgbin/pg_ctl" -D "$pgdir/data" -m immediate stop >/dev/null 2>&1
    cp "$pgdir/postgres.log" "$logs/postgres.log" 2>/dev/null
    rm -rf "$pgdir"
    pgdir=""
}
pg_as() (  # a PostgreSQL program with the carried libraries, as $pguser, in / (a subshell)
    local cmd=(env LD_LIBRARY_PATH="$pgroot/usr/lib/x86_64-linux-gnu" TZ=UTC "$@")
    cd / || exit 1
    if [[ -z $pguser ]]; then
        "${cmd[@]}"
    elif command -v setpriv >/dev/null; then
        setpriv --reuid="$pguser" --regid="$(id -g "$pguser")" --clear-groups -- "${cmd[@]}"
    elif command -v runuser >/dev/null; then
        runuser -u "$pguser" -- "${cmd[@]}"
    else
        su -s /bin/sh "$pguser" -c "$(printf '%q ' "${cmd[@]}")"
    fi
)
pg_start() {
    pgroot=${TCTUNE_PG_ROOT:-/tmp/tctune_pgroot}
    pgbin=$pgroot/usr/lib/postgresql/15/bin
    if [[ ! -x $pgbin/postgres ]]; then
        [[ -f .pg/postgresql.tar.xz ]] || { echo "run_e2e: no .pg/postgresql.tar.xz (carry .pg)" >&2; return 1; }
        mkdir -p "$pgroot" && chmod 755 "$pgroot"
        python3 - "$pgroot" <<'EOF' || return 1
import sys, tarfile
with tarfile.open(".pg/postgresql.tar.xz") as tar:
    tar.extractall(sys.argv[1], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
EOF
    fi
    pguser=""
    if ((EUID == 0)); then  # initdb and postgres refuse to run as root
        pguser=${TCTUNE_PG_USER:-nobody}
    fi
    pgdir=$(mktemp -d /tmp/tctune_pg.XXXXXX) && chmod 755 "$pgdir"
    [[ -n $pguser ]] && chown "$pguser" "$pgdir"
    pg_as "$pgbin/initdb" -D "$pgdir/data" -U postgres --auth=trust --encoding=UTF8 \
        --locale=C --no-sync >"$pgdir/initdb.log" 2>&1 ||
        { cat "$pgdir/initdb.log" >&2; return 1; }
    pgport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # A benchmark database, thrown away at the end: no fsync, no synchronous commit.
    pg_as "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgres.log" -w -t 60 \
        -o "-p $pgport -c listen_addresses=127.0.0.1 -c unix_socket_directories=$pgdir \
            -c max_connections=500 -c shared_buffers=1GB -c fsync=off \
            -c synchronous_commit=off -c full_page_writes=off -c jit=off" start >/dev/null ||
        { cat "$pgdir/postgres.log" >&2; return 1; }
    local admin=postgresql://postgres@127.0.0.1:$pgport/postgres
    python3 -c "import psycopg, sys; psycopg.connect(sys.argv[1], autocommit=True).execute('CREATE DATABASE tctune')" "$admin" ||
        return 1
    export TCTUNE_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$pgport/tctune
    echo "run_e2e: PostgreSQL $(pg_as "$pgbin/postgres" --version | awk '{print $3}')" \
        "(carried) on 127.0.0.1:$pgport as ${pguser:-$(id -un)}, data in $pgdir"
}

logs=$(mktemp -d "/tmp/${tag}_logs.XXXXXX")
trap 'pg_stop' EXIT
trap 'exit 130' INT TERM
if [[ $db == postgres ]]; then
    pg_start || { echo "run_e2e: PostgreSQL did not start" >&2; exit 1; }
else
    unset TCTUNE_DATABASE_URL
fi
if [[ -z $sim ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    # cuda-bindings is the image's own (not carried): say which, and that NVRTC answers.
    python3 -c 'import cuda.bindings as b; from cuda.bindings import nvrtc; print("cuda-bindings", b.__version__, "nvrtc", nvrtc.nvrtcVersion()[1:])' ||
        echo "run_e2e: cuda-bindings/NVRTC not usable: builds will fail" >&2
fi
python3 bench/e2e_gpu.py --db "$db" --out "$out/$tag.json" --logs "$logs" "${args[@]}"
rc=$?
pg_stop
tar -C "$logs" -czf "$out/${tag}_logs.tgz" . && rm -rf "$logs"
echo "run_e2e: rc=$rc, $out/$tag.json, $out/${tag}_logs.tgz"
exit $rc
