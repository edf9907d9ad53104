#pragma once
// Scheduler-wide counters for metrics and dashboards.

#include <cstdint>

namespace tokenspeed {

// Page counts per tier satisfy total = free + active + cached. active: held by running
// requests (their private pages and the cached pages their prefixes lock); cached: held only by
// the prefix cache; evictable: reclaimable right now (every cached page is, since locks cover
// whole paths, so evictable == cached; kept separate for consumers that should not rely on it).
struct SchedulerStats {
  int32_t num_waiting = 0;     // submitted, never run
  int32_t num_prefilling = 0;  // running, prompt not fully computed yet
  int32_t num_decoding = 0;
  int32_t num_retracted = 0;  // preempted, waiting to resume
  int32_t device_pages_total = 0;
  int32_t device_pages_free = 0;
  int32_t device_pages_active = 0;
  int32_t device_pages_cached = 0;
  int32_t device_pages_evictable = 0;
  int32_t host_pages_total = 0;
  int32_t host_pages_free = 0;
  int32_t host_pages_active = 0;
  int32_t host_pages_cached = 0;
  int32_t host_pages_evictable = 0;
  int64_t prefix_cache_queried_tokens = 0;  // prompt tokens looked up at first admission
  int64_t prefix_cache_hit_tokens = 0;      // of those, found cached (device or host)
  int64_t num_preemptions = 0;
  int32_t num_cache_ops_in_flight = 0;  // planned copies not yet reported done
};

}  // namespace tokenspeed
