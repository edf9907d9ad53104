// Scheduler: construction, submission, execution events and introspection. Planning lives in
// scheduler_plan.cpp.
#include "tokenspeed/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace tokenspeed {
namespace {

std::string quote_id(std::string_view id) {
  std::string out;
  out.reserve(id.size() + 2);
  out.append(1, '\'').append(id).append(1, '\'');
  return out;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config.resolved()),
      page_size_(config_.page_size),
      decode_tokens_(config_.decode_input_tokens),
      events_(config_.enable_kv_events, config_.page_size),
      kv_(config_.page_size, config_.num_device_pages, config_.num_host_pages,
          config_.enable_prefix_cache, &events_),
      req_pool_(config_.max_batch_size, "request pool slots"),
      table_(config_.max_batch_size,
             pages_for(*config_.max_model_len + config_.decode_input_tokens - 1)),
      owners_{&kv_, &table_, &req_pool_},
      slot_owner_(static_cast<size_t>(config_.max_batch_size), nullptr) {}

Scheduler::~Scheduler() = default;

// --- submission ----------------------------------------------------------------------------

void Scheduler::submit_requests(std::vector<RequestSpec> specs) {
  const int32_t max_len = *config_.max_model_len;
  std::unordered_set<std::string_view> batch_ids;
  for (const RequestSpec& s : specs) {
    const std::string who = "request " + quote_id(s.request_id);
    if (s.request_id.empty()) throw std::invalid_argument("request id must not be empty");
    if (requests_.contains(s.request_id) || !batch_ids.insert(s.request_id).second) {
      throw std::invalid_argument("duplicate request id " + quote_id(s.request_id));
    }
    if (s.tokens.empty()) throw std::invalid_argument(who + ": the prompt is empty");
    if (std::any_of(s.tokens.begin(), s.tokens.end(), [](int32_t t) { return t < 0; })) {
      throw std::invalid_argument(who + ": token ids must be non-negative");
    }
    if (s.max_new_tokens < 1) {
      throw std::invalid_argument(who + ": max_new_tokens must be >= 1 (got " +
                                  std::to_string(s.max_new_tokens) + ")");
    }
    const int64_t total = static_cast<int64_t>(s.tokens.size()) + s.max_new_tokens;
    if (total > max_len) {
      throw std::invalid_argument(who + ": prompt (" + std::to_string(s.tokens.size()) +
                                  " tokens) + max_new_tokens (" + std::to_string(s.max_new_tokens) +
                                  ") = " + std::to_string(total) + " exceeds max_model_len (" +
                                  std::to_string(max_len) + ")");
    }
    const int64_t pages = (total + decode_tokens_ - 1 + page_size_ - 1) / page_size_;
    if (pages > config_.num_device_pages) {
      throw std::invalid_argument(who + ": needs up to " + std::to_string(pages) +
                                  " KV pages but the device has only " +
                                  std::to_string(config_.num_device_pages));
    }
  }
  for (RequestSpec& s : specs) {
    auto r = std::make_unique<Request>();
    r->id = std::move(s.request_id);
    r->priority = s.priority;
    r->seq = next_seq_++;
    r->tokens = std::move(s.tokens);
    r->prompt_len = r->num_tokens();
    r->max_new_tokens = s.max_new_tokens;
    r->tokens.reserve(static_cast<size_t>(r->prompt_len + r->max_new_tokens));
    r->stats.request_id = r->id;
    r->stats.prompt_tokens = r->prompt_len;
    ++state_counts_[r->state.index()];
    waiting_.insert(key_of(*r));
    std::string id = r->id;
    requests_.emplace(std::move(id), std::move(r));
  }
}

// --- execution events ----------------------------------------------------------------------

void Scheduler::advance(const ExecutionEvent& event) {
  std::visit([&](const auto& e) { advance(e); }, event);
}

void Scheduler::advance(const FinishRequest& e) {
  finish(*find_or_throw(e.request_id), e.reason, /*aborted=*/false);
}

void Scheduler::advance(const AbortRequest& e) {
  // Idempotent: an abort may race with the request's own end.
  if (Request* r = find(e.request_id)) finish(*r, "abort", /*aborted=*/true);
}

void Scheduler::advance(const LoadBackDone& e) {
  if (ops_in_flight_.erase(e.op_id) == 0) {
    throw std::invalid_argument("LoadBackDone: unknown or completed op " + std::to_string(e.op_id));
  }
}

void Scheduler::advance(const ExtendResult& e) {
  Request& r = *find_or_throw(e.request_id);
  if (std::holds_alternative<fsm::Finished>(r.state)) return;  // e.g. aborted meanwhile
  if (e.tokens.empty()) {
    // A prefill chunk that did not finish its prompt samples nothing.
    if (std::holds_alternative<fsm::Prefilling>(r.state)) return;
    throw fsm::InvalidTransition(r.id, "ExtendResult(no tokens)", fsm::state_name(r.state));
  }
  on_tokens(r, e.tokens);
}

void Scheduler::advance(const ForwardResult& e) {
  if (e.forward_id != last_forward_id_ || last_forward_reported_) {
    throw std::invalid_argument("ForwardResult: forward " + std::to_string(e.forward_id) +
                                " is not the latest unreported forward (" +
                                std::to_string(last_forward_id_) + ")");
  }
  const size_t n = last_forward_sampled_.size();
  if (!e.counts.empty() && e.counts.size() != n) {
    throw std::invalid_argument("ForwardResult: " + std::to_string(e.counts.size()) +
                                " counts for " + std::to_string(n) + " sampled requests");
  }
  size_t expected = e.counts.empty() ? n : 0;
  for (int32_t c : e.counts) {
    if (c < 0) throw std::invalid_argument("ForwardResult: negative count");
    expected += static_cast<size_t>(c);
  }
  if (e.tokens.size() != expected) {
    throw std::invalid_argument("ForwardResult: " + std::to_string(e.tokens.size()) +
                                " tokens, expected " + std::to_string(expected));
  }
  last_forward_reported_ = true;
  const std::span<const int32_t> tokens(e.tokens);
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t count = e.counts.empty() ? 1 : static_cast<size_t>(e.counts[i]);
    Request& r = *last_forward_sampled_[i];
    if (count > 0 && !std::holds_alternative<fsm::Finished>(r.state)) {
      on_tokens(r, tokens.subspan(offset, count));
    }
    offset += count;
  }
}

void Scheduler::on_tokens(Request& r, std::span<const int32_t> tokens) {
  const bool after_prefill = std::holds_alternative<fsm::PrefillDone>(r.state);
  const size_t most = after_prefill ? 1 : static_cast<size_t>(decode_tokens_);
  if (tokens.size() > most) {
    throw std::invalid_argument("request " + quote_id(r.id) + ": " + std::to_string(tokens.size()) +
                                " tokens reported, at most " + std::to_string(most) +
                                " expected from this step");
  }
  transition(r, fsm::TokensSampled{});  // validates the state
  ForwardResources& res = *fsm::resources_of(r.state);
  const int32_t room =
      std::min(r.max_new_tokens - r.output_len(), *config_.max_model_len - r.num_tokens());
  const int32_t n = std::min(static_cast<int32_t>(tokens.size()), room);
  if (n == 1) {
    r.tokens.push_back(tokens[0]);
  } else {
    r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.begin() + n);
  }
  if (after_prefill) {
    table_.mark_decoding(res.slot());
  } else {
    res.kv_len += n;  // the input token and the accepted drafts now hold KV
    note_computed(r, res);
  }
  r.stats.output_tokens = r.output_len();
  if (r.output_len() >= r.max_new_tokens || r.num_tokens() >= *config_.max_model_len) {
    finish(r, "length", /*aborted=*/false);
  }
}

void Scheduler::advance(const WriteBackDone& e) {
  const uint64_t op_id = e.op_id;
  if (ops_in_flight_.erase(op_id) == 0) {
    throw std::invalid_argument("WriteBackDone: unknown or completed op " + std::to_string(op_id));
  }
  const auto it = write_back_waiters_.find(op_id);
  if (it == write_back_waiters_.end()) return;
  for (Request* r : it->second) {
    transition(*r, fsm::WriteBackDone{});
    waiting_.insert(key_of(*r));
  }
  write_back_waiters_.erase(it);
}

void Scheduler::finish(Request& r, const std::string& reason, bool aborted) {
  if (std::holds_alternative<fsm::Finished>(r.state)) return;  // double finish is harmless
  if (ForwardResources* res = fsm::resources_of(r.state)) {
    // The forwards that computed these pages have run (events come after them), so they can
    // serve later requests. An abort may come from a failed step: publish nothing then.
    if (!aborted) publish_computed_pages(r, *res);
    running_.erase(key_of(r));
    slot_owner_[static_cast<size_t>(res->slot())] = nullptr;
  } else if (const auto* retracting = std::get_if<fsm::Retracting>(&r.state)) {
    auto& waiters = write_back_waiters_[retracting->write_back_op];
    std::erase(waiters, &r);
  } else {
    waiting_.erase(key_of(r));
  }
  if (aborted) {
    transition(r, fsm::Abort{});
  } else {
    transition(r, fsm::Finish{reason});
  }
  r.stats.finished = true;
  r.stats.finish_reason = std::get<fsm::Finished>(r.state).reason;
  const auto node = requests_.extract(r.id);
  finished_by_id_[r.id] = &r;
  recently_finished_.push_back(std::move(node.mapped()));
}

void Scheduler::publish_computed_pages(Request& r, ForwardResources& res) {
  if (!kv_.prefix_cache_enabled() || res.publishing_stopped) return;
  const int32_t full = res.kv_len / page_size_;
  if (full <= res.num_tree_pages) return;
  r.hash_pages(full, page_size_);
  RadixTree& tree = kv_.tree();
  while (res.num_tree_pages < full) {
    const int32_t index = res.num_tree_pages;
    const int32_t page = res.pages[static_cast<size_t>(index)];
    const auto ins = tree.insert(res.path_node, r.page_hashes[static_cast<size_t>(index)],
                                 r.page_tokens(index, page_size_), page);
    if (ins.node == kNoNode) {
      res.publishing_stopped = true;  // a hash collision: keep the rest private
      return;
    }
    if (ins.device_page != page) {
      // Computed concurrently by another request: share its page, drop ours.
      kv_.free_device(page);
      res.replace_page(index, ins.device_page);
    }
    tree.lock_child(ins.node);
    res.path_node = ins.node;
    ++res.num_tree_pages;
  }
}

Request* Scheduler::find(std::string_view id) const {
  if (const auto it = requests_.find(id); it != requests_.end()) return it->second.get();
  if (const auto it = finished_by_id_.find(id); it != finished_by_id_.end()) return it->second;
  return nullptr;
}

Request* Scheduler::find_or_throw(std::string_view id) const {
  Request* r = find(id);
  if (r == nullptr) {
    throw UnknownRequest("unknown request id " + quote_id(id) +
                         " (never submitted, or finished before the previous plan)");
  }
  return r;
}

// --- introspection -------------------------------------------------------------------------

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_waiting = count_states<fsm::Waiting>();
  s.num_prefilling = count_states<fsm::Prefilling, fsm::PrefillDone>();
  s.num_decoding = count_states<fsm::Decoding>();
  s.num_retracted = count_states<fsm::Retracting, fsm::Retracted>();
  const RadixTree& tree = kv_.tree();
  s.device_pages_total = kv_.device().capacity();
  s.device_pages_free = kv_.device().num_free();
  s.device_pages_cached = tree.device_pages() - tree.locked_device_pages();
  s.device_pages_active = s.device_pages_total - s.device_pages_free - s.device_pages_cached;
  s.device_pages_evictable = kv_.evictable_device_pages();
  s.host_pages_total = kv_.host().capacity();
  s.host_pages_free = kv_.host().num_free();
  s.host_pages_active = tree.locked_host_pages();
  s.host_pages_cached = tree.host_pages() - tree.locked_host_pages();
  s.host_pages_evictable = s.host_pages_cached;
  s.prefix_cache_queried_tokens = queried_tokens_;
  s.prefix_cache_hit_tokens = hit_tokens_;
  s.num_preemptions = preemptions_;
  s.num_cache_ops_in_flight = static_cast<int32_t>(ops_in_flight_.size());
  return s;
}

RequestStats Scheduler::request_stats(std::string_view request_id) const {
  Request& r = *find_or_throw(request_id);
  RequestStats out = r.stats;
  out.state = fsm::state_name(r.state);
  out.output_tokens = r.output_len();
  const ForwardResources* res = fsm::resources_of(r.state);
  out.computed_tokens = res != nullptr ? res->kv_len : 0;
  return out;
}

bool Scheduler::reset_prefix_cache() { return kv_.reset(); }

PageOwners Scheduler::page_owners() const {
  PageOwners out;
  out.device_free = kv_.device().free_ids();
  out.host_free = kv_.host().free_ids();
  const RadixTree& tree = kv_.tree();
  for (NodeId id : tree.live_nodes()) {
    const RadixNode& n = tree.node(id);
    if (n.device_page >= 0) out.tree_device.push_back(n.device_page);
    if (n.host_page >= 0) out.tree_host.push_back(n.host_page);
  }
  for (const auto& [id, r] : requests_) {
    const ForwardResources* res = fsm::resources_of(r->state);
    if (res == nullptr) continue;
    out.request_private.emplace_back(
        id, std::vector<int32_t>(res->pages.begin() + res->num_tree_pages, res->pages.end()));
    const int32_t row = table_.row_of(res->slot());
    const int32_t* data = table_.row_data(row);
    out.request_rows.emplace_back(id, std::vector<int32_t>(data, data + table_.row_length(row)));
  }
  return out;
}

void Scheduler::check_invariants() const {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::logic_error("scheduler invariant: " + what);
  };
  const RadixTree& tree = kv_.tree();
  tree.check_invariants();
  // Every device page has exactly one owner: the free list, a cache node, or one request.
  std::vector<int32_t> device_owner(static_cast<size_t>(kv_.device().capacity()), 0);
  std::vector<int32_t> host_owner(static_cast<size_t>(kv_.host().capacity()), 0);
  const PageOwners owners = page_owners();
  for (int32_t p : owners.device_free) ++device_owner[static_cast<size_t>(p)];
  for (int32_t p : owners.tree_device) ++device_owner[static_cast<size_t>(p)];
  for (const auto& [id, pages] : owners.request_private) {
    for (int32_t p : pages) ++device_owner[static_cast<size_t>(p)];
  }
  for (int32_t p : owners.host_free) ++host_owner[static_cast<size_t>(p)];
  for (int32_t p : owners.tree_host) ++host_owner[static_cast<size_t>(p)];
  for (size_t p = 0; p < device_owner.size(); ++p) {
    require(device_owner[p] == 1, "device page " + std::to_string(p) + " has " +
                                      std::to_string(device_owner[p]) + " owners");
  }
  for (size_t p = 0; p < host_owner.size(); ++p) {
    require(host_owner[p] == 1,
            "host page " + std::to_string(p) + " has " + std::to_string(host_owner[p]) + " owners");
  }
  // Running requests: the block-table row mirrors the pages, and the cached part of the pages
  // is exactly the locked path.
  int32_t running = 0;
  for (const auto& [id, r] : requests_) {
    const ForwardResources* res = fsm::resources_of(r->state);
    if (res == nullptr) continue;
    ++running;
    require(slot_owner_[static_cast<size_t>(res->slot())] == r.get(), "slot owner of " + id);
    const int32_t row = table_.row_of(res->slot());
    require(row >= 0, "no block-table row for " + id);
    require(table_.row_length(row) == static_cast<int32_t>(res->pages.size()) &&
                std::equal(res->pages.begin(), res->pages.end(), table_.row_data(row)),
            "block-table row of " + id + " differs from its pages");
    require(res->kv_len <= static_cast<int32_t>(res->pages.size()) * page_size_,
            "kv_len of " + id + " exceeds its pages");
    NodeId node = res->path_node;
    for (int32_t i = res->num_tree_pages - 1; i >= 0; --i) {
      require(node != kRootNode && tree.node(node).lock_count > 0 &&
                  tree.node(node).device_page == res->pages[static_cast<size_t>(i)],
              "cached pages of " + id + " differ from its locked path");
      node = tree.node(node).parent;
    }
    require(node == kRootNode, "locked path of " + id + " is longer than its cached pages");
  }
  require(running == static_cast<int32_t>(running_.size()), "running set size");
  require(running == req_pool_.num_used(), "request pool slots in use");
  const SchedulerStats s = stats();
  require(
      s.device_pages_total == s.device_pages_free + s.device_pages_active + s.device_pages_cached,
      "device page counts do not add up");
  require(s.host_pages_total == s.host_pages_free + s.host_pages_active + s.host_pages_cached,
          "host page counts do not add up");
}

}  // namespace tokenspeed
