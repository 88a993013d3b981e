#!/usr/bin/env bash
# Gather what the service needs on a GPU machine that has no network, into three git-ignored
# folders to name in the device tool's `carry`:
#   .whl/   Python 3.12 wheels of tctune's dependencies that the GPU image lacks
#   .redis/ Debian's redis-server with its libraries (.debs, unpacked there with dpkg -x)
#   .pg/    PostgreSQL 15 (Debian bookworm's server package and every library it loads
#           beyond glibc, libstdc++ and libgcc), unpacked and trimmed here to what initdb,
#           pg_ctl and postgres use, packed as one postgresql.tar.xz (the .debs whole would
#           not fit the tool's 64 MiB working tree limit: ICU, LLVM bitcode, contrib, docs)
# Run from the repository root on a Debian/Ubuntu x86-64 machine with apt-get, dpkg-deb,
# readelf and xz. Prints the sizes; the whole working tree that travels must stay < 64 MiB.
set -euo pipefail
for d in .whl .redis .pg; do
    grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf .whl .redis .pg && mkdir -p .whl .redis .pg

# --- wheels ------------------------------------------------------------------------------
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
# cuda-bindings and cuda-pathfinder are preinstalled on the GPU machines' image and
# 8.4 MB: not carried, so that PostgreSQL fits. psycopg[binary] bundles its own libpq.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl \
    fastapi uvicorn sqlalchemy alembic pydantic pydantic-settings celery redis xgboost-cpu \
    httpx rich click prometheus-client plotly "psycopg[binary]"
# The GPU image has these already (PyTorch's environment); two versions would clash.
rm -f .whl/numpy-* .whl/scipy-* .whl/typing_extensions-* .whl/packaging-* \
    .whl/cuda_bindings-* .whl/cuda_pathfinder-*

# --- redis -------------------------------------------------------------------------------
(cd .redis && apt-get download -q redis-server redis-tools libjemalloc2 liblzf1 2>/dev/null)

# --- PostgreSQL --------------------------------------------------------------------------
# The server and the closure of the libraries it links (checked below), from the archive this
# machine's apt points at (Debian 12 here: PostgreSQL 15, glibc 2.36, which runs on any
# x86-64 glibc >= 2.36, e.g. Ubuntu 24.04's 2.39).
pg_debs=(postgresql-15 libpq5 libicu72 libxml2 liblzma5 zlib1g libldap-2.5-0 libsasl2-2
         libgnutls30 libp11-kit0 libffi8 libidn2-0 libunistring2 libtasn1-6 libnettle8
         libhogweed6 libgmp10 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0
         libkeyutils1 libcom-err2 libssl3 liblz4-1 libzstd1 libpam0g libaudit1 libcap-ng0
         libsystemd0 libgcrypt20 libgpg-error0 libcap2)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q "${pg_debs[@]}" 2>/dev/null)
for f in "$tmp"/*.deb; do dpkg-deb -x "$f" "$tmp/root"; done
ls "$tmp"/*.deb | xargs -n1 basename > .pg/DEBS
root=$tmp/root
lib=$root/usr/lib/x86_64-linux-gnu
if [[ -d $root/lib/x86_64-linux-gnu ]]; then  # not merged-/usr: one library folder
    cp -a "$root"/lib/x86_64-linux-gnu/. "$lib"/ && rm -rf "$root/lib"
fi
pgl=$root/usr/lib/postgresql/15
# What initdb, pg_ctl and postgres read: no JIT (jit=off), no contrib, no docs or locales.
find "$pgl/bin" -type f ! -name postgres ! -name initdb ! -name pg_ctl -delete
find "$pgl/bin" -type l -delete
find "$pgl/lib" -mindepth 1 -maxdepth 1 ! -name plpgsql.so ! -name dict_snowball.so \
    ! -name 'utf8_and_*.so' ! -name 'euc*.so' ! -name 'latin*.so' ! -name 'cyrillic*.so' \
    ! -name libpqwalreceiver.so ! -name pgoutput.so -exec rm -rf {} +
find "$root/usr/share/postgresql/15/extension" -type f ! -name 'plpgsql*' -delete
rm -rf "$root/usr/share/postgresql/15/man" "$root/usr/share/doc" "$root/usr/share/man" \
    "$root/usr/share/locale" "$root/usr/share/lintian" "$root/usr/share/bug" \
    "$root/usr/share/postgresql-common" "$root/etc" "$root/usr/bin" "$root/usr/sbin" \
    "$lib"/libicutest* "$lib"/libicutu* "$lib"/libicuio* "$lib"/engines-3 "$lib"/ossl-modules \
    "$lib"/sasl2 "$lib"/security "$lib"/pkgconfig "$lib"/gconv
# Every library that a kept program or module needs is carried, except glibc's own and the
# C++ runtime, which every glibc Linux has.
base='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so'
missing=$(find "$pgl" "$lib" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
    xargs -0 readelf -d 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u |
    while read -r so; do
        [[ -e $lib/$so ]] || [[ $so =~ $base ]] || echo "$so"
    done)
if [[ -n $missing ]]; then
    echo "fetch_deps: PostgreSQL needs libraries that are not carried: $missing" >&2
    exit 1
fi
tar -C "$root" -cf - usr | xz -T0 -9 > .pg/postgresql.tar.xz
du -sh .whl .redis .pg
du -sbc .whl .redis .pg | tail -1 | awk '{printf "carry: %.1f MiB\n", $1 / 1048576}'
