#pragma once
// The control plane: request FSMs, KV resources and one ExecutionPlan per step.

#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tokenspeed/block_table.h"
#include "tokenspeed/config.h"
#include "tokenspeed/forward_resources.h"
#include "tokenspeed/index_allocator.h"
#include "tokenspeed/kv_cache_manager.h"
#include "tokenspeed/kv_events.h"
#include "tokenspeed/plan.h"
#include "tokenspeed/radix_tree.h"
#include "tokenspeed/request.h"
#include "tokenspeed/stats.h"

namespace tokenspeed {

// An event or query named a request id the scheduler does not know.
class UnknownRequest : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which owner holds each page, for tests and debugging tools.
struct PageOwners {
  std::vector<int32_t> device_free;
  std::vector<int32_t> host_free;
  std::vector<int32_t> tree_device;  // device pages held by cache nodes
  std::vector<int32_t> tree_host;
  // Per running request: its private device pages and its whole block-table row.
  std::vector<std::pair<std::string, std::vector<int32_t>>> request_private;
  std::vector<std::pair<std::string, std::vector<int32_t>>> request_rows;
};

// Plans, never executes. The engine submits requests, asks for one plan per step, runs it (its
// cache ops first, in order, then its forward) and reports what happened with execution events
// before asking for the next plan; pages a plan's forward computes are published to the prefix
// cache when the next plan is built.
//
// Single-threaded by design: all methods must be called from one thread (the engine loop);
// there is no internal locking and no global state, so Scheduler objects are independent.
class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler();

  const SchedulerConfig& config() const { return config_; }

  // All or nothing: throws std::invalid_argument for a request that can never run (empty
  // prompt, prompt + max_new_tokens > max_model_len, more pages than the device has) or a
  // duplicate id, before any request of the batch is accepted.
  void submit_requests(std::vector<RequestSpec> specs);
  ExecutionPlan next_execution_plan();
  void advance(const ExecutionEvent& event);
  // The same, one overload per event type (no variant copy on the hot path).
  void advance(const ExtendResult& e);
  void advance(const ForwardResult& e);
  void advance(const FinishRequest& e);
  void advance(const AbortRequest& e);
  void advance(const WriteBackDone& e);
  void advance(const LoadBackDone& e);

  std::vector<KvEvent> drain_kv_events() { return events_.drain(); }
  SchedulerStats stats() const;
  // Known from submission until the plan after the request finished.
  RequestStats request_stats(std::string_view request_id) const;
  CacheSnapshot cache_snapshot(int32_t max_nodes) const { return kv_.tree().snapshot(max_nodes); }
  // Drops the whole prefix cache when no running request uses it (emits AllBlocksCleared).
  bool reset_prefix_cache();

  int32_t num_unfinished() const { return static_cast<int32_t>(requests_.size()); }
  bool has_unfinished() const { return !requests_.empty(); }

  PageOwners page_owners() const;
  // Verifies page ownership, block tables, tree invariants and counters from scratch; throws
  // std::logic_error on the first violation. O(pages); for tests.
  void check_invariants() const;

 private:
  struct QueueKey {
    int32_t priority;
    uint64_t seq;
    Request* request;
    auto operator<=>(const QueueKey&) const = default;
  };
  struct Scheduled {
    Request* request;
    int32_t prefix_len;
    int32_t extend_len;
    bool sample;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using RequestMap =
      std::unordered_map<std::string, std::unique_ptr<Request>, StringHash, std::equal_to<>>;

  // --- planning (scheduler_plan.cpp)
  void begin_step();
  void plan_step();
  int32_t schedule_decodes();
  void schedule_prefills(int32_t budget);
  bool admit(Request& r, int32_t budget, int32_t reserve);
  void schedule_chunk(Request& r, int32_t chunk);
  // The largest chunk up to `wanted` tokens that the available pages can hold.
  int32_t fit_chunk(const ForwardResources& res, int32_t wanted) const;
  bool grow_pages(ForwardResources& res, int32_t kv_target);
  void retract(Request& r);
  Request* youngest_retractable() const;
  ExecutionPlan build_plan();
  std::shared_ptr<ForwardOp> build_forward_op();
  uint64_t write_back_op_id();

  // --- events (scheduler.cpp)
  void on_tokens(Request& r, std::span<const int32_t> tokens);
  void finish(Request& r, const std::string& reason, bool aborted);
  void publish_computed_pages(Request& r, ForwardResources& res);
  // Queues `r` for publishing at the next plan if its KV now fills a page not yet published.
  void note_computed(Request& r, const ForwardResources& res) {
    if (res.kv_len / page_size_ > res.num_tree_pages && !res.publishing_stopped) {
      to_publish_.push_back(&r);
    }
  }
  template <class E>
  void transition(Request& r, E event) {
    const size_t before = r.state.index();
    fsm::apply(r.state, std::move(event), r.id);
    --state_counts_[before];
    ++state_counts_[r.state.index()];
  }
  Request* find(std::string_view id) const;
  Request* find_or_throw(std::string_view id) const;
  template <class... States>
  int32_t count_states() const {
    return (state_counts_[fsm::kStateIndex<States>] + ...);
  }
  int32_t pages_for(int32_t positions) const { return (positions + page_size_ - 1) / page_size_; }
  static QueueKey key_of(Request& r) { return {r.priority, r.seq, &r}; }

  // Resource owners are declared before the requests, so requests are destroyed first and
  // give everything back into live owners.
  SchedulerConfig config_;
  int32_t page_size_;
  int32_t decode_tokens_;
  KvEventLog events_;
  KvCacheManager kv_;
  ReqPoolAllocator req_pool_;
  BlockTable table_;
  ResourceOwners owners_;
  RequestMap requests_;                                      // unfinished
  std::vector<std::unique_ptr<Request>> recently_finished_;  // until the next plan
  std::unordered_map<std::string, Request*, StringHash, std::equal_to<>> finished_by_id_;
  std::vector<Request*> slot_owner_;
  std::set<QueueKey> waiting_;  // Waiting and Retracted, in run order
  std::set<QueueKey> running_;  // Prefilling, PrefillDone and Decoding, in run order
  std::unordered_map<uint64_t, std::vector<Request*>> write_back_waiters_;
  std::unordered_set<uint64_t> ops_in_flight_;
  std::array<int32_t, std::variant_size_v<fsm::State>> state_counts_{};

  uint64_t tick_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t next_op_id_ = 1;
  uint64_t next_forward_id_ = 1;
  uint64_t plan_write_back_op_ = 0;  // id reserved for this plan's write-back op, 0 if none
  ForwardMode last_mode_ = ForwardMode::kIdle;
  bool stuck_prefill_ = false;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t preemptions_ = 0;

  // The latest forward, for ForwardResult: its sampled requests in forward order.
  uint64_t last_forward_id_ = 0;
  bool last_forward_reported_ = true;
  std::vector<Request*> last_forward_sampled_;

  // Running requests with computed pages not yet published (pages fill at most one per step).
  std::vector<Request*> to_publish_;
  // Per-step scratch, reused to keep the step allocation-free.
  std::vector<Scheduled> decode_step_;
  std::vector<Scheduled> extend_step_;
  std::vector<int32_t> fresh_pages_;
};

}  // namespace tokenspeed
