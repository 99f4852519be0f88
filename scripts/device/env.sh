# Sourced at the start of every device run: the wheels the GPU machine lacks, our tree on the path, a triton cache.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/python PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.cache/triton  # ignored and not carried: compiled kernels kept while the machine stays warm
