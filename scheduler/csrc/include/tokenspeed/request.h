#pragma once
// A request: its tokens, its place in the queues, its FSM state and its statistics.

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenspeed/request_fsm.h"

namespace tokenspeed {

// What the engine submits. Lower priority values run first; ties run in arrival order.
struct RequestSpec {
  std::string request_id;
  std::vector<int32_t> tokens;
  int32_t max_new_tokens = 0;
  int32_t priority = 0;
};

// What the scheduler knows about one request, for per-request stats lines and usage fields.
struct RequestStats {
  std::string request_id;
  std::string state;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t cached_tokens = 0;       // prefix-cache hit at first admission (device + host)
  int32_t host_cached_tokens = 0;  // part of cached_tokens loaded back from the host
  int32_t computed_tokens = 0;     // positions whose KV the request holds now
  int32_t preempt_count = 0;
  double preempt_ms = 0.0;  // total time spent retracted
  bool finished = false;
  std::string finish_reason;  // empty until finished
};

struct Request {
  using Clock = std::chrono::steady_clock;

  // Hot fields first: a decode step touches only these (one or two cache lines per request).
  fsm::State state;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 0;

  std::string id;
  int32_t priority = 0;
  uint64_t seq = 0;                   // arrival order
  std::vector<uint64_t> page_hashes;  // chained hashes of the first full pages, grown lazily
  RequestStats stats;
  bool admitted_once = false;
  Clock::time_point retracted_at{};

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t output_len() const { return num_tokens() - prompt_len; }
  std::span<const int32_t> page_tokens(int32_t page, int32_t page_size) const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(page) * page_size,
                                                    static_cast<size_t>(page_size));
  }
  // Makes page_hashes cover the first `num_pages` full pages.
  void hash_pages(int32_t num_pages, int32_t page_size);
};

}  // namespace tokenspeed
