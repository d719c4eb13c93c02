"""A small CUDA workload for `cargo xtask gpu-check`, with no toolkit needed: the
driver JIT-compiles a PTX kernel. Three phases of STEPS steps each, as engines call the
driver: eager steps (4 kernel launches, a synchronous copy to the host, a context
synchronize: a prefill), the same through the per-thread default stream entry points
(_ptsz / _ptds, when the driver exports them), and decode-like steps that replay a CUDA
graph captured from one launch, copy asynchronously and synchronize the stream. Prints
one line per phase; a phase the driver refuses is skipped with the reason."""
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


class Refused(Exception):
    pass


def check(result, what, fatal=True):
    if result != 0:
        if fatal:
            sys.exit(f"{what}: CUresult {result}")
        raise Refused(f"{what}: CUresult {result}")


def entry(name):
    try:
        return getattr(cu, name)
    except AttributeError:
        raise Refused(f"libcuda does not export {name}")


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
src = ctypes.c_uint64(dptr.value)
size = ctypes.c_size_t(1024)

for _ in range(steps):
    for _ in range(4):
        check(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel")
    check(cu.cuMemcpyDtoH_v2(host, src, size), "cuMemcpyDtoH_v2")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print(f"workload: eager: {steps} steps of 4 kernels + copy + sync")

try:
    launch = entry("cuLaunchKernel_ptsz")
    copy = entry("cuMemcpyDtoHAsync_v2_ptsz")
    sync = entry("cuStreamSynchronize_ptsz")
    for _ in range(steps):
        for _ in range(4):
            check(launch(fn, 1, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel_ptsz", False)
        check(copy(host, src, size, None), "cuMemcpyDtoHAsync_v2_ptsz", False)
        check(sync(None), "cuStreamSynchronize_ptsz", False)
    print(f"workload: per-thread stream: {steps} steps through the _ptsz entry points")
except Refused as e:
    print(f"workload: per-thread stream: skipped ({e})")

try:
    stream = ctypes.c_void_p()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate", False)  # non-blocking
    check(entry("cuStreamBeginCapture_v2")(stream, 2), "cuStreamBeginCapture_v2", False)  # relaxed
    check(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, None), "cuLaunchKernel (capture)", False)
    graph = ctypes.c_void_p()
    check(cu.cuStreamEndCapture(stream, ctypes.byref(graph)), "cuStreamEndCapture", False)
    exe = ctypes.c_void_p()
    check(entry("cuGraphInstantiateWithFlags")(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
          "cuGraphInstantiateWithFlags", False)
    for _ in range(steps):
        check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch", False)
        check(cu.cuMemcpyDtoHAsync_v2(host, src, size, stream), "cuMemcpyDtoHAsync_v2", False)
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize", False)
    print(f"workload: graphs: {steps} steps of a graph launch + async copy + stream sync")
except Refused as e:
    print(f"workload: graphs: skipped ({e})")
