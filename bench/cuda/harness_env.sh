# Sourced by the `loom bench` scripts here (sharing_e2e.sh, alora_pipeline.sh,
# kvflow_sequential.sh). On the GPU machine (DEVICE=cuda, the default): the
# carried package (device_env.sh) and the harness's Python libraries
# (.carry/py: httpx and its dependencies; the device has no network). Off it
# (DEVICE=cpu, for a dry run): whatever LOOM, MODEL and OUT name.
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  . "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
  mkdir -p /tmp/loom/py
  tar xJf .carry/py/pylibs.tar.xz -C /tmp/loom/py
  export PYTHONPATH=/tmp/loom/py
fi
export LOOM_SOURCE_DIR=$PWD
OUT=${OUT:-/tmp/loom-out}
mkdir -p "$OUT"
LOOM=${LOOM:-/tmp/loom/bin/loom}
MODEL=${MODEL:-random:llama-8b}
