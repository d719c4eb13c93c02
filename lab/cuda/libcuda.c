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
 *
 * As the real driver does, cuInit loads CUDA_INJECTION64_PATH and calls its
 * InitializeInjection (tokenscope's CUPTI hook). The simulated span of every launch is
 * then handed to the stand-in libcupti, when one is loaded, as the real driver feeds
 * CUPTI's activity records: kernels, graph launches and copies with their device start
 * and end, stream and correlation id.
 * The per-thread default stream entry points (`_ptsz`, what the runtime calls when built
 * with --default-stream per-thread) are exported too, with the same behaviour.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stddef.h>
#include <time.h>
#include <errno.h>
#include <pthread.h>
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* _v2: 64-bit on LP64 */
typedef struct CUfunc_st *CUfunction;
typedef struct CUctx_st *CUcontext;
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
    /* Calls through the per-thread default stream (_ptsz) entry points, of the above. */
    uint64_t per_thread_stream;
    /* Of the synchronisations, calls through cuCtxSynchronize / cuCtxSynchronize_v2. */
    uint64_t ctx_synchronize;
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

/* Activity kinds handed to the stand-in libcupti (its own record kinds differ). */
enum { LAB_ACT_KERNEL = 1, LAB_ACT_MEMCPY = 2, LAB_ACT_GRAPH = 3 };

/* standin_cupti_activity(kind, stream, start_ns, end_ns, correlation, graph_id, bytes, name),
 * exported by the stand-in libcupti; times in CLOCK_MONOTONIC ns. */
typedef void (*activity_sink_fn)(uint32_t, uint32_t, uint64_t, uint64_t, uint32_t, uint32_t,
                                 uint64_t, const char *);
static activity_sink_fn activity_sink;
static uint32_t next_correlation = 1;
/* The device span of the work queued since the last synchronisation (lab_cuda_last_sync). */
static uint64_t window_start_ns, last_sync_start_ns, last_sync_end_ns;

/* Queue work of duration_ns on the timeline: it starts when the previous work ends.
 * Returns its correlation id and device span. */
static uint32_t enqueue_work(uint64_t duration_ns, uint64_t *start, uint64_t *end) {
    uint64_t now = now_ns();
    pthread_mutex_lock(&lock);
    if (busy_until_ns < now)
        busy_until_ns = now;
    if (!window_start_ns)
        window_start_ns = busy_until_ns;
    *start = busy_until_ns;
    busy_until_ns += duration_ns;
    *end = busy_until_ns;
    uint32_t correlation = next_correlation++;
    pthread_mutex_unlock(&lock);
    return correlation;
}

static void report(uint32_t kind, uint32_t correlation, uint64_t start, uint64_t end,
                   uint32_t graph_id, uint64_t bytes, const char *name) {
    activity_sink_fn sink = __atomic_load_n(&activity_sink, __ATOMIC_ACQUIRE);
    if (sink)
        sink(kind, 7, start, end, correlation, graph_id, bytes, name);
}

/* The loaded objects' names, gathered by dl_iterate_phdr's callback. */
#define MAX_OBJECTS 1024
struct object_names {
    size_t n;
    char *name[MAX_OBJECTS];
};

static int gather_name(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct object_names *names = data;
    if (info->dlpi_name && info->dlpi_name[0] && names->n < MAX_OBJECTS)
        names->name[names->n++] = strdup(info->dlpi_name);
    return 0;
}

/* Finds standin_cupti_activity in whatever loaded it: the hook dlopens libcupti with
 * RTLD_LOCAL, so the symbol is not global; look in every loaded object. The names are
 * gathered first and looked into after the iteration: dlopen inside dl_iterate_phdr's
 * callback takes the loader's lock while the iteration holds its own, and a thread in
 * dlopen meanwhile takes the two the other way round (two lab engines in one test
 * process, one in cuInit and one loading this library, deadlocked a CI run). */
static void *find_sink(void) {
    struct object_names *names = calloc(1, sizeof *names);
    if (!names)
        return NULL;
    dl_iterate_phdr(gather_name, names);
    void *found = NULL;
    for (size_t i = 0; i < names->n; i++) {
        if (!found && names->name[i]) {
            void *h = dlopen(names->name[i], RTLD_NOW | RTLD_NOLOAD);
            if (h) {
                found = dlsym(h, "standin_cupti_activity");
                dlclose(h);
            }
        }
        free(names->name[i]);
    }
    free(names);
    return found;
}

/* What the driver does at cuInit for CUDA_INJECTION64_PATH: load it, call InitializeInjection. */
static void load_injection(void) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (path && path[0]) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = h ? (int (*)(void))dlsym(h, "InitializeInjection") : NULL;
        if (init)
            init();
    }
    __atomic_store_n(&activity_sink, (activity_sink_fn)find_sink(), __ATOMIC_RELEASE);
}

__attribute__((visibility("default"), noinline))
CUresult cuInit(unsigned int flags) {
    __atomic_fetch_add(&counters.init, 1, __ATOMIC_RELAXED);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!__atomic_exchange_n(&initialized, 1, __ATOMIC_ACQ_REL))
        load_injection();
    return CUDA_SUCCESS;
}

static CUresult launch_kernel(int ptsz, CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
    (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)extra;
    __atomic_fetch_add(&counters.launch_kernel, 1, __ATOMIC_RELAXED);
    if (ptsz)
        __atomic_fetch_add(&counters.per_thread_stream, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (f == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (kernelParams == NULL || kernelParams[0] == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t start, end;
    uint32_t c = enqueue_work(*(const uint64_t *)kernelParams[0], &start, &end);
    report(LAB_ACT_KERNEL, c, start, end, 0, 0, "lab_prefill_attn");
    return CUDA_SUCCESS;
}

static CUresult graph_launch(int ptsz, CUgraphExec hGraphExec, CUstream hStream) {
    (void)hStream;
    __atomic_fetch_add(&counters.graph_launch, 1, __ATOMIC_RELAXED);
    if (ptsz)
        __atomic_fetch_add(&counters.per_thread_stream, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    const struct lab_graph_exec *g = (const struct lab_graph_exec *)hGraphExec;
    if (g == NULL || g->magic != LAB_GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t start, end;
    uint32_t c = enqueue_work(g->duration_ns, &start, &end);
    report(LAB_ACT_GRAPH, c, start, end, 1, 0, "lab_decode_graph");
    return CUDA_SUCCESS;
}

static CUresult memcpy_dtoh_async(int ptsz, void *dstHost, CUdeviceptr srcDevice,
                                  size_t ByteCount, CUstream hStream) {
    (void)hStream;
    __atomic_fetch_add(&counters.memcpy_dtoh_async, 1, __ATOMIC_RELAXED);
    if (ptsz)
        __atomic_fetch_add(&counters.per_thread_stream, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dstHost == NULL && ByteCount > 0)
        return CUDA_ERROR_INVALID_VALUE;
    (void)srcDevice;
    /* A token-id copy is a few bytes: cost it at ~1 ns per byte, after the queued work. */
    uint64_t start, end;
    uint32_t c = enqueue_work((uint64_t)ByteCount, &start, &end);
    report(LAB_ACT_MEMCPY, c, start, end, 0, (uint64_t)ByteCount, NULL);
    return CUDA_SUCCESS;
}

/* A stream's or the whole context's synchronisation: the lab has one timeline. */
static CUresult synchronize(int ptsz, int ctx) {
    __atomic_fetch_add(&counters.stream_synchronize, 1, __ATOMIC_RELAXED);
    if (ptsz)
        __atomic_fetch_add(&counters.per_thread_stream, 1, __ATOMIC_RELAXED);
    if (ctx)
        __atomic_fetch_add(&counters.ctx_synchronize, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    uint64_t until = busy_until_ns;
    if (window_start_ns) {
        last_sync_start_ns = window_start_ns;
        last_sync_end_ns = until;
        window_start_ns = 0;
    }
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
    out->per_thread_stream = __atomic_load_n(&counters.per_thread_stream, __ATOMIC_RELAXED);
    out->ctx_synchronize = __atomic_load_n(&counters.ctx_synchronize, __ATOMIC_RELAXED);
}

/* Lab-only: the device span of the work the last synchronisation waited for (first
 * queued work's start, last one's end), as a GPU trace would show the step. */
__attribute__((visibility("default"), noinline))
void lab_cuda_last_sync(uint64_t *start_ns, uint64_t *end_ns) {
    pthread_mutex_lock(&lock);
    *start_ns = last_sync_start_ns;
    *end_ns = last_sync_end_ns;
    pthread_mutex_unlock(&lock);
}

/* The exported entry points have the shape of NVIDIA's (libcuda 535.261 and 550.163 read):
 * the driver's deinitialised check, `cmpl $0x321cba00, state(%rip)` and `je` to a
 * `return CUDA_ERROR_DEINITIALIZED`, then a jump into the implementation with every
 * argument register untouched. Written in assembly so the compiler cannot reorder or
 * merge them: the probes meet exactly the instructions a real driver gives them (the
 * compiled thin wrappers before began with a tail call's `mov`, which uprobes single-step
 * out of line, unlike the real driver's entries: tokenscope probes past the guard).
 * The plain and the per-thread default stream variants (`_ptsz`: cuda.h maps the plain
 * names to these under CUDA_API_PER_THREAD_DEFAULT_STREAM) are distinct functions a
 * uprobe sees once per call. The lab has one timeline, so both share it. */
#define CUDA_ERROR_DEINITIALIZED 4
#define LAB_DRIVER_DEINITIALIZED 0x321cba00
__attribute__((visibility("hidden"))) int lab_driver_state;

/* The driver is unloading: calls from here on return CUDA_ERROR_DEINITIALIZED. */
__attribute__((destructor)) static void lab_driver_unload(void) {
    __atomic_store_n(&lab_driver_state, LAB_DRIVER_DEINITIALIZED, __ATOMIC_RELAXED);
}

#define STR_(x) #x
#define STR(x) STR_(x)
#define DRIVER_ENTRY(name)                                                                    \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n.p2align 4\n" #name ":\n" \
            "  cmpl $" STR(LAB_DRIVER_DEINITIALIZED) ", lab_driver_state(%rip)\n"            \
            "  je 1f\n"                                                                       \
            "  jmp lab_" #name "\n"                                                           \
            "1:\n  mov $" STR(CUDA_ERROR_DEINITIALIZED) ", %eax\n  ret\n"                    \
            ".size " #name ", .-" #name "\n")
#define IMPL __attribute__((visibility("hidden"), noinline, used))

#define LAUNCH_KERNEL_PARAMS                                                                  \
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,       \
        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,               \
        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra
#define LAUNCH_KERNEL_ARGS                                                                    \
    f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, \
        kernelParams, extra

IMPL CUresult lab_cuLaunchKernel(LAUNCH_KERNEL_PARAMS) { return launch_kernel(0, LAUNCH_KERNEL_ARGS); }
IMPL CUresult lab_cuLaunchKernel_ptsz(LAUNCH_KERNEL_PARAMS) {
    return launch_kernel(1, LAUNCH_KERNEL_ARGS);
}
DRIVER_ENTRY(cuLaunchKernel);
DRIVER_ENTRY(cuLaunchKernel_ptsz);

IMPL CUresult lab_cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(0, hGraphExec, hStream);
}
IMPL CUresult lab_cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(1, hGraphExec, hStream);
}
DRIVER_ENTRY(cuGraphLaunch);
DRIVER_ENTRY(cuGraphLaunch_ptsz);

IMPL CUresult lab_cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                       CUstream hStream) {
    return memcpy_dtoh_async(0, dstHost, srcDevice, ByteCount, hStream);
}
IMPL CUresult lab_cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                            size_t ByteCount, CUstream hStream) {
    return memcpy_dtoh_async(1, dstHost, srcDevice, ByteCount, hStream);
}
DRIVER_ENTRY(cuMemcpyDtoHAsync_v2);
DRIVER_ENTRY(cuMemcpyDtoHAsync_v2_ptsz);

IMPL CUresult lab_cuStreamSynchronize(CUstream hStream) {
    (void)hStream;
    return synchronize(0, 0);
}
IMPL CUresult lab_cuStreamSynchronize_ptsz(CUstream hStream) {
    (void)hStream;
    return synchronize(1, 0);
}
DRIVER_ENTRY(cuStreamSynchronize);
DRIVER_ENTRY(cuStreamSynchronize_ptsz);

/* The whole context. CUDA 13 added the _v2 form, which takes the context, and its runtime
 * calls it for cudaDeviceSynchronize (torch.cuda.synchronize()): cuGetProcAddress hands
 * out cuCtxSynchronize_v2 for version 13000 (seen on an H200, driver 580.159). */
IMPL CUresult lab_cuCtxSynchronize(void) { return synchronize(0, 1); }
IMPL CUresult lab_cuCtxSynchronize_v2(CUcontext ctx) {
    (void)ctx;
    return synchronize(0, 1);
}
DRIVER_ENTRY(cuCtxSynchronize);
DRIVER_ENTRY(cuCtxSynchronize_v2);
