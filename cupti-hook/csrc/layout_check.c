/* Compiled by tests/layout.rs against the real CUPTI headers (downloaded at test time):
 * every stand-in record field must sit where CUPTI puts it, and the printed table is
 * compared with the Rust mirror in src/bindings.rs. Generated from standin_records.h. */
#include <stddef.h>
#include <stdio.h>
#include <cupti.h>
#include "standin_records.h"

#define SAME(si, real, field) \
  _Static_assert(offsetof(si, field) == offsetof(real, field), #real "." #field " moved"); \
  _Static_assert(sizeof(((si *)0)->field) == sizeof(((real *)0)->field), #real "." #field " resized");
#define SAME_VALUE(si, real) _Static_assert((int)si == (int)real, #real " changed value");

SAME(si_kernel9, CUpti_ActivityKernel9, kind)
SAME(si_kernel9, CUpti_ActivityKernel9, cacheConfig)
SAME(si_kernel9, CUpti_ActivityKernel9, sharedMemoryConfig)
SAME(si_kernel9, CUpti_ActivityKernel9, registersPerThread)
SAME(si_kernel9, CUpti_ActivityKernel9, partitionedGlobalCacheRequested)
SAME(si_kernel9, CUpti_ActivityKernel9, partitionedGlobalCacheExecuted)
SAME(si_kernel9, CUpti_ActivityKernel9, start)
SAME(si_kernel9, CUpti_ActivityKernel9, end)
SAME(si_kernel9, CUpti_ActivityKernel9, completed)
SAME(si_kernel9, CUpti_ActivityKernel9, deviceId)
SAME(si_kernel9, CUpti_ActivityKernel9, contextId)
SAME(si_kernel9, CUpti_ActivityKernel9, streamId)
SAME(si_kernel9, CUpti_ActivityKernel9, gridX)
SAME(si_kernel9, CUpti_ActivityKernel9, gridY)
SAME(si_kernel9, CUpti_ActivityKernel9, gridZ)
SAME(si_kernel9, CUpti_ActivityKernel9, blockX)
SAME(si_kernel9, CUpti_ActivityKernel9, blockY)
SAME(si_kernel9, CUpti_ActivityKernel9, blockZ)
SAME(si_kernel9, CUpti_ActivityKernel9, staticSharedMemory)
SAME(si_kernel9, CUpti_ActivityKernel9, dynamicSharedMemory)
SAME(si_kernel9, CUpti_ActivityKernel9, localMemoryPerThread)
SAME(si_kernel9, CUpti_ActivityKernel9, localMemoryTotal)
SAME(si_kernel9, CUpti_ActivityKernel9, correlationId)
SAME(si_kernel9, CUpti_ActivityKernel9, gridId)
SAME(si_kernel9, CUpti_ActivityKernel9, name)
SAME(si_kernel9, CUpti_ActivityKernel9, reserved0)
SAME(si_kernel9, CUpti_ActivityKernel9, queued)
SAME(si_kernel9, CUpti_ActivityKernel9, submitted)
SAME(si_kernel9, CUpti_ActivityKernel9, launchType)
SAME(si_kernel9, CUpti_ActivityKernel9, isSharedMemoryCarveoutRequested)
SAME(si_kernel9, CUpti_ActivityKernel9, sharedMemoryCarveoutRequested)
SAME(si_kernel9, CUpti_ActivityKernel9, padding)
SAME(si_kernel9, CUpti_ActivityKernel9, sharedMemoryExecuted)
SAME(si_kernel9, CUpti_ActivityKernel9, graphNodeId)
SAME(si_kernel9, CUpti_ActivityKernel9, shmemLimitConfig)
SAME(si_kernel9, CUpti_ActivityKernel9, graphId)
SAME(si_kernel9, CUpti_ActivityKernel9, pAccessPolicyWindow)
SAME(si_kernel9, CUpti_ActivityKernel9, channelID)
SAME(si_kernel9, CUpti_ActivityKernel9, channelType)
SAME(si_kernel9, CUpti_ActivityKernel9, clusterX)
SAME(si_kernel9, CUpti_ActivityKernel9, clusterY)
SAME(si_kernel9, CUpti_ActivityKernel9, clusterZ)
SAME(si_kernel9, CUpti_ActivityKernel9, clusterSchedulingPolicy)
SAME(si_kernel9, CUpti_ActivityKernel9, localMemoryTotal_v2)
SAME(si_kernel9, CUpti_ActivityKernel9, maxPotentialClusterSize)
SAME(si_kernel9, CUpti_ActivityKernel9, maxActiveClusters)
_Static_assert(sizeof(si_kernel9) == sizeof(CUpti_ActivityKernel9), "CUpti_ActivityKernel9 size");
SAME(si_memcpy6, CUpti_ActivityMemcpy6, kind)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, copyKind)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, srcKind)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, dstKind)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, flags)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, bytes)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, start)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, end)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, deviceId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, contextId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, streamId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, correlationId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, runtimeCorrelationId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, pad)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, reserved0)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, graphNodeId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, graphId)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, channelID)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, channelType)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, pad2)
SAME(si_memcpy6, CUpti_ActivityMemcpy6, copyCount)
_Static_assert(sizeof(si_memcpy6) == sizeof(CUpti_ActivityMemcpy6), "CUpti_ActivityMemcpy6 size");
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, kind)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, correlationId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, start)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, end)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, deviceId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, graphId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, contextId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, streamId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, reserved)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, endDeviceId)
SAME(si_graph_trace2, CUpti_ActivityGraphTrace2, endContextId)
_Static_assert(sizeof(si_graph_trace2) == sizeof(CUpti_ActivityGraphTrace2), "CUpti_ActivityGraphTrace2 size");
SAME(si_marker2, CUpti_ActivityMarker2, kind)
SAME(si_marker2, CUpti_ActivityMarker2, flags)
SAME(si_marker2, CUpti_ActivityMarker2, timestamp)
SAME(si_marker2, CUpti_ActivityMarker2, id)
SAME(si_marker2, CUpti_ActivityMarker2, objectKind)
SAME(si_marker2, CUpti_ActivityMarker2, objectId)
SAME(si_marker2, CUpti_ActivityMarker2, pad)
SAME(si_marker2, CUpti_ActivityMarker2, name)
SAME(si_marker2, CUpti_ActivityMarker2, domain)
_Static_assert(sizeof(si_marker2) == sizeof(CUpti_ActivityMarker2), "CUpti_ActivityMarker2 size");
SAME_VALUE(SI_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY)
SAME_VALUE(SI_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
SAME_VALUE(SI_KIND_MARKER, CUPTI_ACTIVITY_KIND_MARKER)
SAME_VALUE(SI_KIND_GRAPH_TRACE, CUPTI_ACTIVITY_KIND_GRAPH_TRACE)
SAME_VALUE(SI_SUCCESS, CUPTI_SUCCESS)
SAME_VALUE(SI_ERROR_INVALID_PARAMETER, CUPTI_ERROR_INVALID_PARAMETER)
SAME_VALUE(SI_ERROR_MAX_LIMIT_REACHED, CUPTI_ERROR_MAX_LIMIT_REACHED)
SAME_VALUE(SI_ERROR_NOT_COMPATIBLE, CUPTI_ERROR_NOT_COMPATIBLE)
SAME_VALUE(SI_ERROR_NOT_INITIALIZED, CUPTI_ERROR_NOT_INITIALIZED)
SAME_VALUE(SI_ERROR_NOT_SUPPORTED, CUPTI_ERROR_NOT_SUPPORTED)
SAME_VALUE(SI_ERROR_INSUFFICIENT_PRIVILEGES, CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
SAME_VALUE(SI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
SAME_VALUE(SI_FLAG_MARKER_INSTANTANEOUS, CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS)
SAME_VALUE(SI_FLAG_MARKER_START, CUPTI_ACTIVITY_FLAG_MARKER_START)
SAME_VALUE(SI_FLAG_MARKER_END, CUPTI_ACTIVITY_FLAG_MARKER_END)

int main(void) {
  printf("CUpti_ActivityKernel9.kind %zu\n", offsetof(CUpti_ActivityKernel9, kind));
  printf("CUpti_ActivityKernel9.cacheConfig %zu\n", offsetof(CUpti_ActivityKernel9, cacheConfig));
  printf("CUpti_ActivityKernel9.sharedMemoryConfig %zu\n", offsetof(CUpti_ActivityKernel9, sharedMemoryConfig));
  printf("CUpti_ActivityKernel9.registersPerThread %zu\n", offsetof(CUpti_ActivityKernel9, registersPerThread));
  printf("CUpti_ActivityKernel9.partitionedGlobalCacheRequested %zu\n", offsetof(CUpti_ActivityKernel9, partitionedGlobalCacheRequested));
  printf("CUpti_ActivityKernel9.partitionedGlobalCacheExecuted %zu\n", offsetof(CUpti_ActivityKernel9, partitionedGlobalCacheExecuted));
  printf("CUpti_ActivityKernel9.start %zu\n", offsetof(CUpti_ActivityKernel9, start));
  printf("CUpti_ActivityKernel9.end %zu\n", offsetof(CUpti_ActivityKernel9, end));
  printf("CUpti_ActivityKernel9.completed %zu\n", offsetof(CUpti_ActivityKernel9, completed));
  printf("CUpti_ActivityKernel9.deviceId %zu\n", offsetof(CUpti_ActivityKernel9, deviceId));
  printf("CUpti_ActivityKernel9.contextId %zu\n", offsetof(CUpti_ActivityKernel9, contextId));
  printf("CUpti_ActivityKernel9.streamId %zu\n", offsetof(CUpti_ActivityKernel9, streamId));
  printf("CUpti_ActivityKernel9.gridX %zu\n", offsetof(CUpti_ActivityKernel9, gridX));
  printf("CUpti_ActivityKernel9.gridY %zu\n", offsetof(CUpti_ActivityKernel9, gridY));
  printf("CUpti_ActivityKernel9.gridZ %zu\n", offsetof(CUpti_ActivityKernel9, gridZ));
  printf("CUpti_ActivityKernel9.blockX %zu\n", offsetof(CUpti_ActivityKernel9, blockX));
  printf("CUpti_ActivityKernel9.blockY %zu\n", offsetof(CUpti_ActivityKernel9, blockY));
  printf("CUpti_ActivityKernel9.blockZ %zu\n", offsetof(CUpti_ActivityKernel9, blockZ));
  printf("CUpti_ActivityKernel9.staticSharedMemory %zu\n", offsetof(CUpti_ActivityKernel9, staticSharedMemory));
  printf("CUpti_ActivityKernel9.dynamicSharedMemory %zu\n", offsetof(CUpti_ActivityKernel9, dynamicSharedMemory));
  printf("CUpti_ActivityKernel9.localMemoryPerThread %zu\n", offsetof(CUpti_ActivityKernel9, localMemoryPerThread));
  printf("CUpti_ActivityKernel9.localMemoryTotal %zu\n", offsetof(CUpti_ActivityKernel9, localMemoryTotal));
  printf("CUpti_ActivityKernel9.correlationId %zu\n", offsetof(CUpti_ActivityKernel9, correlationId));
  printf("CUpti_ActivityKernel9.gridId %zu\n", offsetof(CUpti_ActivityKernel9, gridId));
  printf("CUpti_ActivityKernel9.name %zu\n", offsetof(CUpti_ActivityKernel9, name));
  printf("CUpti_ActivityKernel9.reserved0 %zu\n", offsetof(CUpti_ActivityKernel9, reserved0));
  printf("CUpti_ActivityKernel9.queued %zu\n", offsetof(CUpti_ActivityKernel9, queued));
  printf("CUpti_ActivityKernel9.submitted %zu\n", offsetof(CUpti_ActivityKernel9, submitted));
  printf("CUpti_ActivityKernel9.launchType %zu\n", offsetof(CUpti_ActivityKernel9, launchType));
  printf("CUpti_ActivityKernel9.isSharedMemoryCarveoutRequested %zu\n", offsetof(CUpti_ActivityKernel9, isSharedMemoryCarveoutRequested));
  printf("CUpti_ActivityKernel9.sharedMemoryCarveoutRequested %zu\n", offsetof(CUpti_ActivityKernel9, sharedMemoryCarveoutRequested));
  printf("CUpti_ActivityKernel9.padding %zu\n", offsetof(CUpti_ActivityKernel9, padding));
  printf("CUpti_ActivityKernel9.sharedMemoryExecuted %zu\n", offsetof(CUpti_ActivityKernel9, sharedMemoryExecuted));
  printf("CUpti_ActivityKernel9.graphNodeId %zu\n", offsetof(CUpti_ActivityKernel9, graphNodeId));
  printf("CUpti_ActivityKernel9.shmemLimitConfig %zu\n", offsetof(CUpti_ActivityKernel9, shmemLimitConfig));
  printf("CUpti_ActivityKernel9.graphId %zu\n", offsetof(CUpti_ActivityKernel9, graphId));
  printf("CUpti_ActivityKernel9.pAccessPolicyWindow %zu\n", offsetof(CUpti_ActivityKernel9, pAccessPolicyWindow));
  printf("CUpti_ActivityKernel9.channelID %zu\n", offsetof(CUpti_ActivityKernel9, channelID));
  printf("CUpti_ActivityKernel9.channelType %zu\n", offsetof(CUpti_ActivityKernel9, channelType));
  printf("CUpti_ActivityKernel9.clusterX %zu\n", offsetof(CUpti_ActivityKernel9, clusterX));
  printf("CUpti_ActivityKernel9.clusterY %zu\n", offsetof(CUpti_ActivityKernel9, clusterY));
  printf("CUpti_ActivityKernel9.clusterZ %zu\n", offsetof(CUpti_ActivityKernel9, clusterZ));
  printf("CUpti_ActivityKernel9.clusterSchedulingPolicy %zu\n", offsetof(CUpti_ActivityKernel9, clusterSchedulingPolicy));
  printf("CUpti_ActivityKernel9.localMemoryTotal_v2 %zu\n", offsetof(CUpti_ActivityKernel9, localMemoryTotal_v2));
  printf("CUpti_ActivityKernel9.maxPotentialClusterSize %zu\n", offsetof(CUpti_ActivityKernel9, maxPotentialClusterSize));
  printf("CUpti_ActivityKernel9.maxActiveClusters %zu\n", offsetof(CUpti_ActivityKernel9, maxActiveClusters));
  printf("CUpti_ActivityKernel9.sizeof %zu\n", sizeof(CUpti_ActivityKernel9));
  printf("CUpti_ActivityMemcpy6.kind %zu\n", offsetof(CUpti_ActivityMemcpy6, kind));
  printf("CUpti_ActivityMemcpy6.copyKind %zu\n", offsetof(CUpti_ActivityMemcpy6, copyKind));
  printf("CUpti_ActivityMemcpy6.srcKind %zu\n", offsetof(CUpti_ActivityMemcpy6, srcKind));
  printf("CUpti_ActivityMemcpy6.dstKind %zu\n", offsetof(CUpti_ActivityMemcpy6, dstKind));
  printf("CUpti_ActivityMemcpy6.flags %zu\n", offsetof(CUpti_ActivityMemcpy6, flags));
  printf("CUpti_ActivityMemcpy6.bytes %zu\n", offsetof(CUpti_ActivityMemcpy6, bytes));
  printf("CUpti_ActivityMemcpy6.start %zu\n", offsetof(CUpti_ActivityMemcpy6, start));
  printf("CUpti_ActivityMemcpy6.end %zu\n", offsetof(CUpti_ActivityMemcpy6, end));
  printf("CUpti_ActivityMemcpy6.deviceId %zu\n", offsetof(CUpti_ActivityMemcpy6, deviceId));
  printf("CUpti_ActivityMemcpy6.contextId %zu\n", offsetof(CUpti_ActivityMemcpy6, contextId));
  printf("CUpti_ActivityMemcpy6.streamId %zu\n", offsetof(CUpti_ActivityMemcpy6, streamId));
  printf("CUpti_ActivityMemcpy6.correlationId %zu\n", offsetof(CUpti_ActivityMemcpy6, correlationId));
  printf("CUpti_ActivityMemcpy6.runtimeCorrelationId %zu\n", offsetof(CUpti_ActivityMemcpy6, runtimeCorrelationId));
  printf("CUpti_ActivityMemcpy6.pad %zu\n", offsetof(CUpti_ActivityMemcpy6, pad));
  printf("CUpti_ActivityMemcpy6.reserved0 %zu\n", offsetof(CUpti_ActivityMemcpy6, reserved0));
  printf("CUpti_ActivityMemcpy6.graphNodeId %zu\n", offsetof(CUpti_ActivityMemcpy6, graphNodeId));
  printf("CUpti_ActivityMemcpy6.graphId %zu\n", offsetof(CUpti_ActivityMemcpy6, graphId));
  printf("CUpti_ActivityMemcpy6.channelID %zu\n", offsetof(CUpti_ActivityMemcpy6, channelID));
  printf("CUpti_ActivityMemcpy6.channelType %zu\n", offsetof(CUpti_ActivityMemcpy6, channelType));
  printf("CUpti_ActivityMemcpy6.pad2 %zu\n", offsetof(CUpti_ActivityMemcpy6, pad2));
  printf("CUpti_ActivityMemcpy6.copyCount %zu\n", offsetof(CUpti_ActivityMemcpy6, copyCount));
  printf("CUpti_ActivityMemcpy6.sizeof %zu\n", sizeof(CUpti_ActivityMemcpy6));
  printf("CUpti_ActivityGraphTrace2.kind %zu\n", offsetof(CUpti_ActivityGraphTrace2, kind));
  printf("CUpti_ActivityGraphTrace2.correlationId %zu\n", offsetof(CUpti_ActivityGraphTrace2, correlationId));
  printf("CUpti_ActivityGraphTrace2.start %zu\n", offsetof(CUpti_ActivityGraphTrace2, start));
  printf("CUpti_ActivityGraphTrace2.end %zu\n", offsetof(CUpti_ActivityGraphTrace2, end));
  printf("CUpti_ActivityGraphTrace2.deviceId %zu\n", offsetof(CUpti_ActivityGraphTrace2, deviceId));
  printf("CUpti_ActivityGraphTrace2.graphId %zu\n", offsetof(CUpti_ActivityGraphTrace2, graphId));
  printf("CUpti_ActivityGraphTrace2.contextId %zu\n", offsetof(CUpti_ActivityGraphTrace2, contextId));
  printf("CUpti_ActivityGraphTrace2.streamId %zu\n", offsetof(CUpti_ActivityGraphTrace2, streamId));
  printf("CUpti_ActivityGraphTrace2.reserved %zu\n", offsetof(CUpti_ActivityGraphTrace2, reserved));
  printf("CUpti_ActivityGraphTrace2.endDeviceId %zu\n", offsetof(CUpti_ActivityGraphTrace2, endDeviceId));
  printf("CUpti_ActivityGraphTrace2.endContextId %zu\n", offsetof(CUpti_ActivityGraphTrace2, endContextId));
  printf("CUpti_ActivityGraphTrace2.sizeof %zu\n", sizeof(CUpti_ActivityGraphTrace2));
  printf("CUpti_ActivityMarker2.kind %zu\n", offsetof(CUpti_ActivityMarker2, kind));
  printf("CUpti_ActivityMarker2.flags %zu\n", offsetof(CUpti_ActivityMarker2, flags));
  printf("CUpti_ActivityMarker2.timestamp %zu\n", offsetof(CUpti_ActivityMarker2, timestamp));
  printf("CUpti_ActivityMarker2.id %zu\n", offsetof(CUpti_ActivityMarker2, id));
  printf("CUpti_ActivityMarker2.objectKind %zu\n", offsetof(CUpti_ActivityMarker2, objectKind));
  printf("CUpti_ActivityMarker2.objectId %zu\n", offsetof(CUpti_ActivityMarker2, objectId));
  printf("CUpti_ActivityMarker2.pad %zu\n", offsetof(CUpti_ActivityMarker2, pad));
  printf("CUpti_ActivityMarker2.name %zu\n", offsetof(CUpti_ActivityMarker2, name));
  printf("CUpti_ActivityMarker2.domain %zu\n", offsetof(CUpti_ActivityMarker2, domain));
  printf("CUpti_ActivityMarker2.sizeof %zu\n", sizeof(CUpti_ActivityMarker2));
  printf("CUPTI_ACTIVITY_KIND_MEMCPY %d\n", (int)CUPTI_ACTIVITY_KIND_MEMCPY);
  printf("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL %d\n", (int)CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  printf("CUPTI_ACTIVITY_KIND_MARKER %d\n", (int)CUPTI_ACTIVITY_KIND_MARKER);
  printf("CUPTI_ACTIVITY_KIND_GRAPH_TRACE %d\n", (int)CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
  printf("CUPTI_SUCCESS %d\n", (int)CUPTI_SUCCESS);
  printf("CUPTI_ERROR_INVALID_PARAMETER %d\n", (int)CUPTI_ERROR_INVALID_PARAMETER);
  printf("CUPTI_ERROR_MAX_LIMIT_REACHED %d\n", (int)CUPTI_ERROR_MAX_LIMIT_REACHED);
  printf("CUPTI_ERROR_NOT_COMPATIBLE %d\n", (int)CUPTI_ERROR_NOT_COMPATIBLE);
  printf("CUPTI_ERROR_NOT_INITIALIZED %d\n", (int)CUPTI_ERROR_NOT_INITIALIZED);
  printf("CUPTI_ERROR_NOT_SUPPORTED %d\n", (int)CUPTI_ERROR_NOT_SUPPORTED);
  printf("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES %d\n", (int)CUPTI_ERROR_INSUFFICIENT_PRIVILEGES);
  printf("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED %d\n", (int)CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  printf("CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS %d\n", (int)CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS);
  printf("CUPTI_ACTIVITY_FLAG_MARKER_START %d\n", (int)CUPTI_ACTIVITY_FLAG_MARKER_START);
  printf("CUPTI_ACTIVITY_FLAG_MARKER_END %d\n", (int)CUPTI_ACTIVITY_FLAG_MARKER_END);
  return 0;
}
