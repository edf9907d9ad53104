#pragma once
// Scheduler configuration.

#include <cstdint>
#include <optional>

namespace tokenspeed {

struct SchedulerConfig {
  int32_t page_size = 16;
  int32_t num_device_pages = 0;
  int32_t num_host_pages = 0;            // 0: no host tier
  int32_t max_scheduled_tokens = 8192;   // per-step token budget (--chunked-prefill-size)
  int32_t max_batch_size = 256;          // running requests and request-pool slots (--max-num-seqs)
  std::optional<int32_t> max_model_len;  // unset: everything the device pages can hold
  bool enable_prefix_cache = true;
  bool enable_mixed_batch = false;
  bool enable_kv_events = false;
  int32_t decode_input_tokens = 1;  // >1: speculative verify, positions reserved per decode step

  // Returns a copy with defaults filled in; throws std::invalid_argument naming the first bad
  // field, so a misconfigured engine fails at start with one clear message.
  SchedulerConfig resolved() const;
  int32_t max_model_len_or_default() const;
};

}  // namespace tokenspeed
