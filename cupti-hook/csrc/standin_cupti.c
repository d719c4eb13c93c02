/* Stand-in libcupti: the CUPTI entry points tokenscope's hook calls, with CUPTI's ABI, handing
 * out activity buffers in CUPTI 12.x record layout (standin_records.h, checked against the real
 * cupti.h by tests/layout.rs). Tests drive it through standin_emit(); behaviour switches:
 *   STANDIN_CUPTI_SUBSCRIBER=taken      cuptiSubscribe -> MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
 *   STANDIN_CUPTI_NO_TS_CALLBACK=1      no timestamp callback: records in CLOCK_REALTIME ns,
 *                                       so the hook must fall back to paired readings
 *   STANDIN_CUPTI_GRAPH_TRACE=exclusive graph-level and kernel/memcpy tracing exclude each
 *                                       other: whichever is enabled second -> NOT_COMPATIBLE
 * Beside the scripted records, the lab's stand-in libcuda hands it the simulated span of every
 * launch (standin_cupti_activity), as the real driver feeds CUPTI, so an engine on the stand-in
 * driver gets kernel, graph and memcpy records for its real work. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "standin_records.h"

typedef void (*buffer_requested_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*buffer_completed_fn)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                    size_t valid);
typedef uint64_t (*timestamp_fn)(void);
typedef void (*callback_fn)(void *userdata, int domain, uint32_t cbid, const void *data);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static buffer_requested_fn on_requested;
static buffer_completed_fn on_completed;
static timestamp_fn user_clock;
static int subscribed;
static uint64_t enabled_kinds; /* bit per kind < 64 */
static uint8_t *cur;
static uint32_t flush_period_ms;
static pthread_t flusher;
static size_t cur_size, cur_used;

static const char *const kernel_names[3] = {"standin_kernel_gemm", "standin_kernel_attention",
                                            "standin_kernel_sampling"};

static int env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v && strcmp(v, value) == 0;
}

static uint64_t own_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now(void) { return user_clock ? user_clock() : own_clock(); }

static uint64_t monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int cuptiGetVersion(uint32_t *version) {
  *version = 28;
  return SI_SUCCESS;
}

int cuptiGetResultString(int result, const char **str) {
  switch (result) {
    case SI_SUCCESS: *str = "CUPTI_SUCCESS"; return SI_SUCCESS;
    case SI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; return SI_SUCCESS;
    case SI_ERROR_NOT_COMPATIBLE: *str = "CUPTI_ERROR_NOT_COMPATIBLE"; return SI_SUCCESS;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return SI_SUCCESS;
  }
}

int cuptiSubscribe(void **subscriber, callback_fn callback, void *userdata) {
  (void)callback; (void)userdata;
  if (env_is("STANDIN_CUPTI_SUBSCRIBER", "taken") || subscribed)
    return SI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  subscribed = 1;
  *subscriber = &subscribed;
  return SI_SUCCESS;
}

int cuptiUnsubscribe(void *subscriber) {
  (void)subscriber;
  subscribed = 0;
  return SI_SUCCESS;
}

int cuptiActivityEnable(uint32_t kind) {
  if (env_is("STANDIN_CUPTI_GRAPH_TRACE", "exclusive")) {
    uint64_t node_level = (1ull << SI_KIND_CONCURRENT_KERNEL) | (1ull << SI_KIND_MEMCPY);
    if (kind == SI_KIND_GRAPH_TRACE && (enabled_kinds & node_level)) return SI_ERROR_NOT_COMPATIBLE;
    if ((1ull << kind) & node_level && (enabled_kinds >> SI_KIND_GRAPH_TRACE) & 1)
      return SI_ERROR_NOT_COMPATIBLE;
  }
  if (kind >= 64) return SI_ERROR_INVALID_PARAMETER;
  enabled_kinds |= 1ull << kind;
  return SI_SUCCESS;
}

int cuptiActivityRegisterCallbacks(buffer_requested_fn requested, buffer_completed_fn completed) {
  if (!requested || !completed) return SI_ERROR_INVALID_PARAMETER;
  on_requested = requested;
  on_completed = completed;
  return SI_SUCCESS;
}

int cuptiActivityRegisterTimestampCallback(timestamp_fn f) {
  if (getenv("STANDIN_CUPTI_NO_TS_CALLBACK")) return SI_ERROR_NOT_SUPPORTED;
  user_clock = f;
  return SI_SUCCESS;
}

int cuptiGetTimestamp(uint64_t *timestamp) {
  *timestamp = own_clock();
  return SI_SUCCESS;
}

static size_t record_size(uint32_t kind) {
  switch (kind) {
    case SI_KIND_CONCURRENT_KERNEL: return sizeof(si_kernel9);
    case SI_KIND_MEMCPY: return sizeof(si_memcpy6);
    case SI_KIND_GRAPH_TRACE: return sizeof(si_graph_trace2);
    case SI_KIND_MARKER: return sizeof(si_marker2);
    default: return 0;
  }
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
  size_t off = 0;
  if (*record) {
    uint8_t *r = *record;
    size_t size = record_size(*(uint32_t *)r);
    if (!size) return SI_ERROR_INVALID_PARAMETER;
    off = (size_t)(r - buffer) + size;
  }
  if (off >= valid) return SI_ERROR_MAX_LIMIT_REACHED;
  *record = buffer + off;
  return SI_SUCCESS;
}

int cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *dropped) {
  (void)ctx; (void)stream;
  *dropped = 0;
  return SI_SUCCESS;
}

/* Hands the current buffer back through the completed callback, as CUPTI's worker does. */
static void complete_current(void) {
  if (!cur) return;
  uint8_t *b = cur;
  size_t size = cur_size, used = cur_used;
  cur = NULL;
  cur_size = cur_used = 0;
  on_completed(NULL, 0, b, size, used);
}

/* Room for one record of `size`, asking the hook for a new buffer when the current is full. */
static void *reserve(size_t size) {
  if (cur && cur_used + size > cur_size) complete_current();
  if (!cur) {
    size_t max_records = 0;
    on_requested(&cur, &cur_size, &max_records);
    cur_used = 0;
    if (!cur || cur_size < size) return NULL;
  }
  void *r = cur + cur_used;
  memset(r, 0, size);
  cur_used += (size + 7) & ~(size_t)7;
  return r;
}

int cuptiActivityFlushAll(uint32_t flag) {
  (void)flag;
  pthread_mutex_lock(&lock);
  if (on_completed) complete_current();
  pthread_mutex_unlock(&lock);
  return SI_SUCCESS;
}

static int enabled(uint32_t kind) { return (enabled_kinds >> kind) & 1; }

/* CUPTI's worker delivers buffers every `time` ms (0: only when full or flushed). */
static void *flush_periodically(void *unused) {
  (void)unused;
  for (;;) {
    uint32_t ms = __atomic_load_n(&flush_period_ms, __ATOMIC_RELAXED);
    struct timespec ts = {(time_t)((ms ? ms : 100) / 1000), (long)((ms ? ms : 100) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    if (ms) cuptiActivityFlushAll(0);
  }
  return NULL;
}

int cuptiActivityFlushPeriod(uint32_t time) {
  pthread_mutex_lock(&lock);
  int start = !flush_period_ms && time && !flusher;
  flush_period_ms = time;
  if (start && pthread_create(&flusher, NULL, flush_periodically, NULL) != 0) flusher = 0;
  pthread_mutex_unlock(&lock);
  return SI_SUCCESS;
}

/* Kernel names live as long as the library (the driver that passed them may be unloaded
 * before the buffer is parsed); a few distinct names are all the lab uses. */
static const char *own_name(const char *name) {
  static char names[16][64];
  static int used;
  if (!name) return NULL;
  for (int i = 0; i < used; i++)
    if (strcmp(names[i], name) == 0) return names[i];
  if (used == 16) return "standin_kernel_other";
  strncpy(names[used], name, sizeof names[used] - 1);
  return names[used++];
}

/* Lab-only: the stand-in libcuda reports one launch's device span (CLOCK_MONOTONIC ns).
 * kind 1 kernel, 2 device-to-host copy, 3 graph launch; written as the record CUPTI would
 * deliver for the kinds the hook enabled (a graph launch without graph-level tracing is a
 * kernel record carrying its graph id), in the clock CUPTI timestamps with. */
void standin_cupti_activity(uint32_t kind, uint32_t stream, uint64_t start_ns, uint64_t end_ns,
                            uint32_t correlation, uint32_t graph_id, uint64_t bytes,
                            const char *name) {
  pthread_mutex_lock(&lock);
  if (!on_requested || !on_completed || !subscribed) {
    pthread_mutex_unlock(&lock);
    return;
  }
  /* The clock CUPTI stamps with less CLOCK_MONOTONIC, bracketed and rounded to the
   * microsecond: exactly 0 when the hook's timestamp callback is CLOCK_MONOTONIC. */
  int64_t shift = 0;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3; i++) { /* the tightest of three readings (the first may fault) */
    uint64_t before = monotonic(), stamp = now(), after = monotonic();
    if (after - before < best) {
      best = after - before;
      shift = (int64_t)(stamp - before / 2 - after / 2);
    }
  }
  shift = (shift >= 0 ? shift + 500 : shift - 500) / 1000 * 1000;
  uint64_t start = start_ns + (uint64_t)shift, end = end_ns + (uint64_t)shift;
  if (kind == 3 && enabled(SI_KIND_GRAPH_TRACE)) {
    si_graph_trace2 *g = reserve(sizeof *g);
    if (g) {
      g->kind = SI_KIND_GRAPH_TRACE;
      g->correlationId = correlation;
      g->start = start;
      g->end = end;
      g->graphId = graph_id;
      g->contextId = 1;
      g->streamId = stream;
    }
  } else if ((kind == 1 || kind == 3) && enabled(SI_KIND_CONCURRENT_KERNEL)) {
    si_kernel9 *k = reserve(sizeof *k);
    if (k) {
      k->kind = SI_KIND_CONCURRENT_KERNEL;
      k->start = start;
      k->end = end;
      k->completed = end;
      k->contextId = 1;
      k->streamId = stream;
      k->gridX = 128; k->gridY = 1; k->gridZ = 1;
      k->blockX = 256; k->blockY = 1; k->blockZ = 1;
      k->correlationId = correlation;
      k->name = own_name(name);
      k->graphId = kind == 3 ? graph_id : 0;
    }
  } else if (kind == 2 && enabled(SI_KIND_MEMCPY)) {
    si_memcpy6 *m = reserve(sizeof *m);
    if (m) {
      m->kind = SI_KIND_MEMCPY;
      m->copyKind = 2; /* DTOH */
      m->bytes = bytes;
      m->start = start;
      m->end = end;
      m->contextId = 1;
      m->streamId = stream;
      m->correlationId = correlation;
    }
  }
  pthread_mutex_unlock(&lock);
}

static void marker(uint32_t flags, uint32_t id, const char *name, const char *domain) {
  si_marker2 *m = reserve(sizeof *m);
  if (!m) return;
  m->kind = SI_KIND_MARKER;
  m->flags = flags;
  m->timestamp = now();
  m->id = id;
  m->name = name;
  m->domain = domain;
}

/* Test control: appends `n` rounds of scripted records in time order. Round i holds a kernel
 * (correlation 1000+i, grid (i+1,2,3), block (128,1,1), stream 7+i%2, name kernel_names[i%3]),
 * a device-to-host memcpy (correlation 5000+i, 4096*(i+1) bytes, stream 7), a graph launch
 * (graph 40+i%4) and an NVTX range "step i" in domain "tokenscope" (id 9000+i), each only
 * when the hook enabled that kind. Returns the number of records written. */
int standin_emit(int n, int with_memcpy, int with_graph, int with_markers) {
  static char range_names[4][16] = {"step 0", "step 1", "step 2", "step 3"};
  int written = 0;
  pthread_mutex_lock(&lock);
  if (!on_requested || !on_completed) {
    pthread_mutex_unlock(&lock);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (with_markers && enabled(SI_KIND_MARKER)) {
      marker(SI_FLAG_MARKER_START, 9000 + i, range_names[i % 4], "tokenscope");
      written++;
    }
    if (enabled(SI_KIND_CONCURRENT_KERNEL)) {
      si_kernel9 *k = reserve(sizeof *k);
      if (!k) break;
      k->kind = SI_KIND_CONCURRENT_KERNEL;
      k->start = now();
      k->end = now() + 1;
      k->completed = k->end;
      k->deviceId = 0;
      k->contextId = 1;
      k->streamId = 7 + i % 2;
      k->gridX = i + 1; k->gridY = 2; k->gridZ = 3;
      k->blockX = 128; k->blockY = 1; k->blockZ = 1;
      k->correlationId = 1000 + i;
      k->name = kernel_names[i % 3];
      k->graphId = with_graph ? 40 + i % 4 : 0;
      written++;
    }
    if (with_memcpy && enabled(SI_KIND_MEMCPY)) {
      si_memcpy6 *m = reserve(sizeof *m);
      if (!m) break;
      m->kind = SI_KIND_MEMCPY;
      m->copyKind = 2; /* DTOH */
      m->bytes = 4096ull * (i + 1);
      m->start = now();
      m->end = now() + 1;
      m->deviceId = 0;
      m->contextId = 1;
      m->streamId = 7;
      m->correlationId = 5000 + i;
      written++;
    }
    if (with_graph && enabled(SI_KIND_GRAPH_TRACE)) {
      si_graph_trace2 *g = reserve(sizeof *g);
      if (!g) break;
      g->kind = SI_KIND_GRAPH_TRACE;
      g->correlationId = 7000 + i;
      g->start = now();
      g->end = now() + 1;
      g->deviceId = 0;
      g->graphId = 40 + i % 4;
      g->contextId = 1;
      g->streamId = 7;
      written++;
    }
    if (with_markers && enabled(SI_KIND_MARKER)) {
      marker(SI_FLAG_MARKER_END, 9000 + i, NULL, NULL);
      written++;
    }
  }
  pthread_mutex_unlock(&lock);
  return written;
}
