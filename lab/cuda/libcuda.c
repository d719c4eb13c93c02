/*
 * Stand-in for the NVIDIA driver (libcuda.so.1) used by the tokenscope lab.
 *
 * It exports the driver entry points the GPU probes attach to, with the real
 * signatures, and simulates one GPU timeline per stream: every launch queues
 * work of a known duration, and cuStreamSynchronize sleeps until the queued
 * work is done. The simulated duration of a launch comes from the lab engine:
 *   - cuLaunchKernel: kernelParams[0] points to a uint64_t duration in ns;
 *   - cuGraphLaunch: hGraphExec points to a struct lab_graph_exec (below).
 * Counters of every call are kept so tests can check the engine really calls in.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stddef.h>
#include <time.h>
#include <errno.h>
#include <pthread.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* _v2: 64-bit on LP64 */
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraphExec_st *CUgraphExec;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_HANDLE 400

#define LAB_GRAPH_MAGIC 0x4c41424752415048ull /* "LABGRAPH" */

/* What the lab engine's CUgraphExec handles point to. */
struct lab_graph_exec {
    uint64_t magic;
    uint64_t duration_ns;
};

/* Call counters, read by tests through lab_cuda_counters(). */
struct lab_cuda_counters {
    uint64_t init;
    uint64_t launch_kernel;
    uint64_t graph_launch;
    uint64_t memcpy_dtoh_async;
    uint64_t stream_synchronize;
};

static struct lab_cuda_counters counters;
static int initialized;
/* One timeline for every stream: the lab engine uses a single stream. */
static uint64_t busy_until_ns;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Queue work of duration_ns on the timeline: it starts when the previous work ends. */
static void enqueue_work(uint64_t duration_ns) {
    uint64_t now = now_ns();
    pthread_mutex_lock(&lock);
    if (busy_until_ns < now)
        busy_until_ns = now;
    busy_until_ns += duration_ns;
    pthread_mutex_unlock(&lock);
}

__attribute__((visibility("default"), noinline))
CUresult cuInit(unsigned int flags) {
    __atomic_fetch_add(&counters.init, 1, __ATOMIC_RELAXED);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"), noinline))
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
    (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)extra;
    __atomic_fetch_add(&counters.launch_kernel, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (f == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (kernelParams == NULL || kernelParams[0] == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    enqueue_work(*(const uint64_t *)kernelParams[0]);
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"), noinline))
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hStream;
    __atomic_fetch_add(&counters.graph_launch, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    const struct lab_graph_exec *g = (const struct lab_graph_exec *)hGraphExec;
    if (g == NULL || g->magic != LAB_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    enqueue_work(g->duration_ns);
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"), noinline))
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream) {
    (void)hStream;
    __atomic_fetch_add(&counters.memcpy_dtoh_async, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dstHost == NULL && ByteCount > 0)
        return CUDA_ERROR_INVALID_VALUE;
    (void)srcDevice;
    /* A token-id copy is a few bytes: cost it at ~1 ns per byte, after the queued work. */
    enqueue_work((uint64_t)ByteCount);
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"), noinline))
CUresult cuStreamSynchronize(CUstream hStream) {
    (void)hStream;
    __atomic_fetch_add(&counters.stream_synchronize, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    uint64_t until = busy_until_ns;
    pthread_mutex_unlock(&lock);
    struct timespec ts = { (time_t)(until / 1000000000ull), (long)(until % 1000000000ull) };
    /* Absolute deadline so wakeups late by scheduling do not accumulate across steps. */
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    return CUDA_SUCCESS;
}

/* Lab-only: copy the call counters out (not a driver symbol). */
__attribute__((visibility("default"), noinline))
void lab_cuda_counters(struct lab_cuda_counters *out) {
    out->init = __atomic_load_n(&counters.init, __ATOMIC_RELAXED);
    out->launch_kernel = __atomic_load_n(&counters.launch_kernel, __ATOMIC_RELAXED);
    out->graph_launch = __atomic_load_n(&counters.graph_launch, __ATOMIC_RELAXED);
    out->memcpy_dtoh_async = __atomic_load_n(&counters.memcpy_dtoh_async, __ATOMIC_RELAXED);
    out->stream_synchronize = __atomic_load_n(&counters.stream_synchronize, __ATOMIC_RELAXED);
}
