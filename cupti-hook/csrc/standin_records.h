/* Activity record layouts of CUPTI 12.x, hand-written so the stand-in libcupti needs no
 * NVIDIA header. tests/layout.rs compiles layout_check.c against the real cupti.h and
 * static-asserts every field below (size and offset) equals the real one. */
#ifndef STANDIN_RECORDS_H
#define STANDIN_RECORDS_H
#include <stdint.h>

#define SI_PACKED __attribute__((__packed__)) __attribute__((aligned(8)))

enum {
  SI_KIND_MEMCPY = 1,
  SI_KIND_CONCURRENT_KERNEL = 10,
  SI_KIND_MARKER = 12,
  SI_KIND_GRAPH_TRACE = 51,
};

enum {
  SI_SUCCESS = 0,
  SI_ERROR_INVALID_PARAMETER = 1,
  SI_ERROR_MAX_LIMIT_REACHED = 12,
  SI_ERROR_NOT_COMPATIBLE = 14,
  SI_ERROR_NOT_INITIALIZED = 15,
  SI_ERROR_NOT_SUPPORTED = 27,
  SI_ERROR_INSUFFICIENT_PRIVILEGES = 35,
  SI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
};

enum {
  SI_FLAG_MARKER_INSTANTANEOUS = 1 << 0,
  SI_FLAG_MARKER_START = 1 << 1,
  SI_FLAG_MARKER_END = 1 << 2,
};

typedef struct SI_PACKED {
  uint32_t kind;
  uint8_t cacheConfig;
  uint8_t sharedMemoryConfig;
  uint16_t registersPerThread;
  uint32_t partitionedGlobalCacheRequested;
  uint32_t partitionedGlobalCacheExecuted;
  uint64_t start;
  uint64_t end;
  uint64_t completed;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  int32_t gridX, gridY, gridZ;
  int32_t blockX, blockY, blockZ;
  int32_t staticSharedMemory;
  int32_t dynamicSharedMemory;
  uint32_t localMemoryPerThread;
  uint32_t localMemoryTotal;
  uint32_t correlationId;
  int64_t gridId;
  const char *name;
  void *reserved0;
  uint64_t queued;
  uint64_t submitted;
  uint8_t launchType;
  uint8_t isSharedMemoryCarveoutRequested;
  uint8_t sharedMemoryCarveoutRequested;
  uint8_t padding;
  uint32_t sharedMemoryExecuted;
  uint64_t graphNodeId;
  uint32_t shmemLimitConfig;
  uint32_t graphId;
  void *pAccessPolicyWindow;
  uint32_t channelID;
  uint32_t channelType;
  uint32_t clusterX, clusterY, clusterZ;
  uint32_t clusterSchedulingPolicy;
  uint64_t localMemoryTotal_v2;
  uint32_t maxPotentialClusterSize;
  uint32_t maxActiveClusters;
} si_kernel9;

typedef struct SI_PACKED {
  uint32_t kind;
  uint8_t copyKind;
  uint8_t srcKind;
  uint8_t dstKind;
  uint8_t flags;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t correlationId;
  uint32_t runtimeCorrelationId;
  uint32_t pad;
  void *reserved0;
  uint64_t graphNodeId;
  uint32_t graphId;
  uint32_t channelID;
  uint32_t channelType;
  uint32_t pad2;
  uint64_t copyCount;
} si_memcpy6;

typedef struct {
  uint32_t kind;
  uint32_t correlationId;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t graphId;
  uint32_t contextId;
  uint32_t streamId;
  void *reserved;
  uint32_t endDeviceId;
  uint32_t endContextId;
} si_graph_trace2;

typedef struct SI_PACKED {
  uint32_t kind;
  uint32_t flags;
  uint64_t timestamp;
  uint32_t id;
  uint32_t objectKind;
  uint32_t objectId[3];
  uint32_t pad;
  const char *name;
  const char *domain;
} si_marker2;

#endif
