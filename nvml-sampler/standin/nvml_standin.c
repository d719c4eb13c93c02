/*
 * Stand-in libnvidia-ml.so.1: the NVML entry points nvml-wrapper calls for the
 * tokenscope sampler, with the real ABI (checked against nvml.h from the PyPI
 * wheel nvidia-nvml-dev-cu12; build with -DSTANDIN_WITH_NVML_H -I<dir of nvml.h>
 * to let the compiler check every prototype and layout against the real header).
 *
 * It serves SCRIPTED values so tests can assert the sampler recorded exactly them.
 * Script: the file named by $TOKENSCOPE_NVML_SCRIPT, else `tokenscope-nvml.script`
 * beside this library (so parallel tests can each use a private copy), else a
 * built-in one-device script. Lines:
 *
 *   # comment
 *   devices N                 number of devices (at most STANDIN_MAX_DEVICES)
 *   name D text...            nvmlDeviceGetName for device D
 *   uuid D text               nvmlDeviceGetUUID for device D
 *   fail_init CODE            nvmlInit_v2 returns CODE (9 = DRIVER_NOT_LOADED)
 *   row D gpu mem sm memclk used power temp throttle tx rx
 *
 * The k-th `row` line of device D is sample k of D. Each query keeps its own
 * cursor per device (the k-th call of that query on D reads row k), so the order
 * in which the sampler issues queries does not matter; past the last row the
 * last row repeats. A column `-` makes that query return NVML_ERROR_NOT_SUPPORTED
 * (utilization is one query: `-` in gpu or mem refuses both). Numbers are decimal
 * or 0x-hex.
 *
 * $TOKENSCOPE_NVML_FAIL_INIT (non-empty) makes nvmlInit_v2 fail with
 * NVML_ERROR_DRIVER_NOT_LOADED, like a host whose NVIDIA kernel module is absent.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STANDIN_WITH_NVML_H
#include <nvml.h>
#else
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};
typedef enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 } nvmlClockType_t;
typedef enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 } nvmlPcieUtilCounter_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define DECLDIR
#endif

#include <stddef.h>
/* Layouts as in nvml.h (x86_64 / aarch64 LP64). */
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(offsetof(nvmlMemory_v2_t, used) == 32, "nvmlMemory_v2_t.used");
_Static_assert(sizeof(nvmlReturn_t) == 4, "nvmlReturn_t");

#define EXPORT __attribute__((visibility("default")))
#define STANDIN_MAX_DEVICES 16
#define STANDIN_MAX_ROWS 4096
#define STANDIN_TEXT 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE / NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define DEVICE_TOTAL_BYTES (141ull << 30)

enum column { GPU, MEM, SM_CLK, MEM_CLK, MEM_USED, POWER, TEMP, THROTTLE, PCIE_TX, PCIE_RX, COLUMNS };
/* One cursor per query: utilization reads GPU and MEM together. */
enum query { Q_UTIL, Q_SM_CLK, Q_MEM_CLK, Q_MEM, Q_POWER, Q_TEMP, Q_THROTTLE, Q_TX, Q_RX, QUERIES };

struct row {
    unsigned long long value[COLUMNS];
    unsigned char refused[COLUMNS];
};

struct device {
    char name[STANDIN_TEXT];
    char uuid[STANDIN_TEXT];
    struct row *rows;
    unsigned int nrows;
    unsigned int cursor[QUERIES];
};

static struct device devices[STANDIN_MAX_DEVICES];
static unsigned int device_count;
static int init_count;
static int fail_init_code;

static const char SIDECAR[] = "tokenscope-nvml.script";
static const char DEFAULT_SCRIPT[] =
    "devices 1\n"
    "name 0 Stand-in NVML device\n"
    "uuid 0 GPU-00000000-0000-0000-0000-000000000000\n"
    "row 0 0 0 1410 1593 0 50000 30 0x1 0 0\n";

static void reset(void)
{
    for (unsigned int i = 0; i < STANDIN_MAX_DEVICES; i++) {
        free(devices[i].rows);
        memset(&devices[i], 0, sizeof(devices[i]));
        snprintf(devices[i].name, STANDIN_TEXT, "Stand-in NVML device %u", i);
        snprintf(devices[i].uuid, STANDIN_TEXT, "GPU-standin-%u", i);
    }
    device_count = 0;
    fail_init_code = NVML_SUCCESS;
}

static int parse_number(const char *tok, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(tok, &end, 0);
    return errno == 0 && end != tok && *end == '\0';
}

static void trim_newline(char *s)
{
    s[strcspn(s, "\r\n")] = '\0';
}

/* Returns 0 on success, or prints why on stderr and returns -1. */
static int parse_line(char *line, unsigned int lineno)
{
    trim_newline(line);
    char *save;
    char *word = strtok_r(line, " \t", &save);
    if (!word || word[0] == '#')
        return 0;
    unsigned long long n;
    if (strcmp(word, "devices") == 0) {
        char *tok = strtok_r(NULL, " \t", &save);
        if (!tok || !parse_number(tok, &n) || n > STANDIN_MAX_DEVICES)
            goto bad;
        device_count = (unsigned int)n;
        return 0;
    }
    if (strcmp(word, "fail_init") == 0) {
        char *tok = strtok_r(NULL, " \t", &save);
        if (!tok || !parse_number(tok, &n))
            goto bad;
        fail_init_code = (int)n;
        return 0;
    }
    char *tok = strtok_r(NULL, " \t", &save);
    if (!tok || !parse_number(tok, &n) || n >= STANDIN_MAX_DEVICES)
        goto bad;
    struct device *dev = &devices[n];
    if (strcmp(word, "name") == 0 || strcmp(word, "uuid") == 0) {
        char *rest = save + strspn(save, " \t");
        snprintf(word[0] == 'n' ? dev->name : dev->uuid, STANDIN_TEXT, "%s", rest);
        return 0;
    }
    if (strcmp(word, "row") == 0) {
        if (dev->nrows == STANDIN_MAX_ROWS)
            goto bad;
        if (!dev->rows && !(dev->rows = calloc(STANDIN_MAX_ROWS, sizeof(struct row))))
            goto bad;
        struct row *row = &dev->rows[dev->nrows];
        for (int c = 0; c < COLUMNS; c++) {
            char *cell = strtok_r(NULL, " \t", &save);
            if (!cell)
                goto bad;
            if (strcmp(cell, "-") == 0)
                row->refused[c] = 1;
            else if (!parse_number(cell, &row->value[c]))
                goto bad;
        }
        if (strtok_r(NULL, " \t", &save))
            goto bad;
        dev->nrows++;
        return 0;
    }
bad:
    fprintf(stderr, "nvml stand-in: script line %u is not understood\n", lineno);
    return -1;
}

static FILE *open_script(void)
{
    const char *path = getenv("TOKENSCOPE_NVML_SCRIPT");
    if (path && *path)
        return fopen(path, "r");
    Dl_info self;
    if (dladdr((void *)open_script, &self) && self.dli_fname) {
        char sidecar[4096];
        const char *slash = strrchr(self.dli_fname, '/');
        int dir_len = slash ? (int)(slash - self.dli_fname) : 1;
        const char *dir = slash ? self.dli_fname : ".";
        snprintf(sidecar, sizeof(sidecar), "%.*s/%s", dir_len, dir, SIDECAR);
        FILE *f = fopen(sidecar, "r");
        if (f)
            return f;
    }
    return fmemopen((void *)DEFAULT_SCRIPT, sizeof(DEFAULT_SCRIPT) - 1, "r");
}

static int load_script(void)
{
    reset();
    FILE *f = open_script();
    if (!f) {
        fprintf(stderr, "nvml stand-in: cannot open script %s\n", getenv("TOKENSCOPE_NVML_SCRIPT"));
        return -1;
    }
    char line[1024];
    unsigned int lineno = 0;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f))
        rc = parse_line(line, ++lineno);
    fclose(f);
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlInit_v2(void)
{
    const char *fail = getenv("TOKENSCOPE_NVML_FAIL_INIT");
    if (fail && *fail)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (init_count == 0) {
        if (load_script() != 0)
            return NVML_ERROR_UNKNOWN;
        if (fail_init_code != NVML_SUCCESS)
            return fail_init_code;
    }
    init_count++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

EXPORT nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--init_count == 0)
        reset();
    return NVML_SUCCESS;
}

EXPORT const char *DECLDIR nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_text("570.00.standin", version, length);
}

EXPORT nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_text("12.570.00.standin", version, length);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(void *)&devices[index];
    return NVML_SUCCESS;
}

static struct device *lookup(nvmlDevice_t handle)
{
    struct device *dev = (struct device *)(void *)handle;
    if (init_count == 0 || dev < devices || dev >= devices + device_count)
        return NULL;
    return dev;
}

/* The row this query reads now; advances the query's cursor. NULL if no rows. */
static const struct row *next_row(struct device *dev, enum query q)
{
    if (dev->nrows == 0)
        return NULL;
    unsigned int k = __atomic_fetch_add(&dev->cursor[q], 1, __ATOMIC_RELAXED);
    return &dev->rows[k < dev->nrows ? k : dev->nrows - 1];
}

static nvmlReturn_t serve(nvmlDevice_t handle, enum query q, enum column c, unsigned long long *out)
{
    struct device *dev = lookup(handle);
    if (!dev)
        return init_count == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    const struct row *row = next_row(dev, q);
    if (!row || row->refused[c])
        return NVML_ERROR_NOT_SUPPORTED;
    *out = row->value[c];
    return NVML_SUCCESS;
}

static nvmlReturn_t serve_uint(nvmlDevice_t handle, enum query q, enum column c, unsigned int *out)
{
    unsigned long long v;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = serve(handle, q, c, &v);
    if (rc == NVML_SUCCESS)
        *out = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct device *dev = lookup(device);
    return dev ? copy_text(dev->name, name, length) : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct device *dev = lookup(device);
    return dev ? copy_text(dev->uuid, uuid, length) : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct device *dev = lookup(device);
    if (!dev || !utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct row *row = next_row(dev, Q_UTIL);
    if (!row || row->refused[GPU] || row->refused[MEM])
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned int)row->value[GPU];
    utilization->memory = (unsigned int)row->value[MEM];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    /* NVML reports graphics and SM clocks from the same domain on current parts. */
    if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS)
        return serve_uint(device, Q_SM_CLK, SM_CLK, clock);
    if (type == NVML_CLOCK_MEM)
        return serve_uint(device, Q_MEM_CLK, MEM_CLK, clock);
    return NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t memory_used(nvmlDevice_t device, unsigned long long *used)
{
    return serve(device, Q_MEM, MEM_USED, used);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long used;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = memory_used(device, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = used > DEVICE_TOTAL_BYTES ? used : DEVICE_TOTAL_BYTES;
    memory->used = used;
    memory->free = memory->total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long used;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = memory_used(device, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = used > DEVICE_TOTAL_BYTES ? used : DEVICE_TOTAL_BYTES;
    memory->reserved = 0;
    memory->used = used;
    memory->free = memory->total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return serve_uint(device, Q_POWER, POWER, power);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return serve_uint(device, Q_TEMP, TEMP, temp);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    return serve(device, Q_THROTTLE, THROTTLE, reasons);
}

/* The newer name of the same query (NVML 12.2+). */
EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksThrottleReasons(device, reasons);
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    if (counter == NVML_PCIE_UTIL_TX_BYTES)
        return serve_uint(device, Q_TX, PCIE_TX, value);
    if (counter == NVML_PCIE_UTIL_RX_BYTES)
        return serve_uint(device, Q_RX, PCIE_RX, value);
    return NVML_ERROR_INVALID_ARGUMENT;
}
