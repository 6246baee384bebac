# Sourced by run_device.sh and serve_check.sh on the GPU machine: unpacks the
# carried package (.carry/cuda: bin/ + the shared libraries the device image
# lacks) into /tmp/loom, stages the first half of the SmolLM2 GGUF, and points
# LD_LIBRARY_PATH at the package and at the device's cuBLAS.
OUT=${OUT:-/tmp/loom-out}
mkdir -p /tmp/loom "$OUT"
# Unpacked once per package: a second script sourcing this beside a running one leaves its binaries alone.
if [ -f .carry/cuda/loom_cuda_pkg.tar.xz ]; then
  sum=$(md5sum < .carry/cuda/loom_cuda_pkg.tar.xz)
  if [ "$(cat /tmp/loom/.unpacked 2>/dev/null)" != "$sum" ]; then
    tar xJf .carry/cuda/loom_cuda_pkg.tar.xz -C /tmp/loom && echo "$sum" > /tmp/loom/.unpacked
  fi
fi
[ -f .carry/smol_a/part ] && cp .carry/smol_a/part /tmp/loom/smol_a
CUBLAS=$(ldconfig -p | awk '/libcublas.so.13 /{print $NF; exit}')
[ -z "$CUBLAS" ] && CUBLAS=$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2>/dev/null | head -1)
[ -z "$CUBLAS" ] && CUBLAS=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib", "libcublas.so.13"))' 2>/dev/null)
export LD_LIBRARY_PATH=/tmp/loom/lib:$(dirname "${CUBLAS:-/usr/local/cuda/lib64/x}")
# NCCL for the KV link's data plane (kvtransfer/nccl loads it at run time): the system's, else PyTorch's.
NCCL=$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')
[ -z "$NCCL" ] && NCCL=$(ls /usr/local/cuda/lib64/libnccl.so.2 2>/dev/null | head -1)
[ -z "$NCCL" ] && NCCL=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
[ -n "$NCCL" ] && export LOOM_NCCL_LIBRARY=$NCCL
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
