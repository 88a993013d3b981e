# Sourced by the GPU scripts from the repository root: the carried wheels (.whl, and .whl_extra
# where carried too: plotly for the service's dashboard) installed into /tmp/site and put on
# PYTHONPATH, once per process tree (a script that runs another passes TCTUNE_WHEELS_READY on,
# so the inner one does not install them again).
if [ -d .whl ]; then
    if [ "${TCTUNE_WHEELS_READY:-}" != 1 ]; then
        pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
            $(ls .whl_extra/*.whl 2>/dev/null) > /tmp/pip.log 2>&1 ||
            tail -n 5 /tmp/pip.log
        export TCTUNE_WHEELS_READY=1
    fi
    export PYTHONPATH=/tmp/site:$PWD
fi
