"""A small CUDA workload for `cargo xtask gpu-check`, with no toolkit needed: the
driver JIT-compiles a PTX kernel. Each step launches 4 kernels, copies to the host
and synchronizes, like an engine's prefill step."""
import ctypes
import ctypes.util
import sys

PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry noop(.param .u64 p) { ret; }
"""

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
cu = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")


def check(result, what):
    if result != 0:
        sys.exit(f"{what}: CUresult {result}")


check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
mod = ctypes.c_void_p()
check(cu.cuModuleLoadData(ctypes.byref(mod), PTX), "cuModuleLoadData")
fn = ctypes.c_void_p()
check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"noop"), "cuModuleGetFunction")
dptr = ctypes.c_uint64()
check(cu.cuMemAlloc_v2(ctypes.byref(dptr), 1024), "cuMemAlloc_v2")
host = (ctypes.c_char * 1024)()
arg = ctypes.c_uint64(dptr.value)
params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
for _ in range(steps):
    for _ in range(4):
        check(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel")
    check(cu.cuMemcpyDtoH_v2(host, ctypes.c_uint64(dptr.value), ctypes.c_size_t(1024)), "cuMemcpyDtoH_v2")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print(f"workload: {steps} steps of 4 kernels + copy + sync")
