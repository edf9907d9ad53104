// Scheduler: building one ExecutionPlan.
//
// A step: publish the pages the previous forward computed, compact the block table, then
//  - decode: every ready decoding request gets the pages its next positions need; when there
//    are not enough, the youngest running requests are retracted until there are;
//  - prefill: running prefills continue (in admission order), then waiting requests are
//    admitted in (priority, arrival) order, head of line first, under the token budget.
// With mixed batches both go into one forward (decodes first, taking their tokens from the
// budget). Without, decode and extend steps alternate while both have work, so neither long
// prompts nor a crowd of decodes can starve the other.
#include <algorithm>
#include <chrono>

#include "tokenspeed/scheduler.h"

namespace tokenspeed {

ExecutionPlan Scheduler::next_execution_plan() {
  begin_step();
  for (;;) {
    plan_step();
    if (!decode_step_.empty() || !extend_step_.empty() || !stuck_prefill_) break;
    // Nothing can run although prefills wait for pages: break the tie by retracting the
    // youngest running request (the oldest one then always progresses).
    Request* victim = youngest_retractable();
    if (victim == nullptr) break;
    retract(*victim);
    table_.compact();
  }
  return build_plan();
}

void Scheduler::begin_step() {
  ++tick_;
  kv_.set_tick(tick_);
  // The previous forward has run: its full pages can serve other requests from now on. (Done
  // before dropping finished requests: the list may name some, which publish nothing.)
  for (Request* r : to_publish_) {
    if (ForwardResources* res = fsm::resources_of(r->state)) publish_computed_pages(*r, *res);
  }
  to_publish_.clear();
  recently_finished_.clear();
  finished_by_id_.clear();
  last_forward_sampled_.clear();
  last_forward_reported_ = true;
  decode_step_.clear();
  extend_step_.clear();
  table_.compact();
}

void Scheduler::plan_step() {
  stuck_prefill_ = false;
  bool ready_decode = false;
  for (int32_t row = 0; row < table_.num_decode_rows() && !ready_decode; ++row) {
    const auto* d = std::get_if<fsm::Decoding>(&slot_owner_[table_.slot_at(row)]->state);
    ready_decode = d != nullptr && !d->in_flight;
  }
  const int32_t budget = config_.max_scheduled_tokens;
  if (config_.enable_mixed_batch) {
    const int32_t used = ready_decode ? schedule_decodes() : 0;
    schedule_prefills(budget - used);
  } else if (ready_decode && last_mode_ == ForwardMode::kExtend) {
    schedule_decodes();
  } else {
    schedule_prefills(budget);
    if (extend_step_.empty() && ready_decode) schedule_decodes();
  }
}

int32_t Scheduler::schedule_decodes() {
  auto ready = [](Request* r) -> fsm::Decoding* {
    auto* d = std::get_if<fsm::Decoding>(&r->state);
    return d != nullptr && !d->in_flight ? d : nullptr;
  };
  auto missing_pages = [&](const ForwardResources& res) {
    return std::max(
        0, pages_for(res.kv_len + decode_tokens_) - static_cast<int32_t>(res.pages.size()));
  };
  // Fast path: enough pages for every decode row even if each needed its most.
  const int32_t most_per_request = pages_for(decode_tokens_) + 1;
  int32_t needed = 0;
  if (static_cast<int64_t>(table_.num_decode_rows()) * most_per_request >
      kv_.available_device_pages()) {
    for (int32_t row = 0; row < table_.num_decode_rows(); ++row) {
      if (auto* d = ready(slot_owner_[table_.slot_at(row)])) needed += missing_pages(d->resources);
    }
  }
  if (needed > kv_.available_device_pages()) {
    while (needed > kv_.available_device_pages()) {
      Request* victim = youngest_retractable();
      if (victim == nullptr) break;
      if (auto* d = ready(victim)) needed -= missing_pages(d->resources);
      retract(*victim);
    }
    table_.compact();
  }
  for (int32_t row = 0; row < table_.num_decode_rows(); ++row) {
    Request* r = slot_owner_[table_.slot_at(row)];
    auto* d = ready(r);
    if (d == nullptr) continue;
    ForwardResources& res = d->resources;
    if (!grow_pages(res, res.kv_len + decode_tokens_)) continue;  // only with results pending
    decode_step_.push_back({r, res.kv_len, decode_tokens_, true});
    transition(*r, fsm::ScheduleDecode{});
  }
  return static_cast<int32_t>(decode_step_.size()) * decode_tokens_;
}

void Scheduler::schedule_prefills(int32_t budget) {
  // Running prefills first, in row (= admission) order, so the scheduled rows stay contiguous.
  for (int32_t row = table_.num_decode_rows(); row < table_.num_rows() && budget > 0; ++row) {
    const int32_t slot = table_.slot_at(row);
    if (slot < 0) continue;
    Request* r = slot_owner_[slot];
    auto* p = std::get_if<fsm::Prefilling>(&r->state);
    if (p == nullptr) continue;
    ForwardResources& res = p->resources;
    const int32_t chunk = fit_chunk(res, std::min(r->num_tokens() - res.kv_len, budget));
    if (chunk == 0) {
      stuck_prefill_ = true;
      continue;
    }
    grow_pages(res, res.kv_len + chunk);
    schedule_chunk(*r, chunk);
    budget -= chunk;
  }
  // Then admissions. Each decoding request keeps one page of headroom, so that admitting a
  // prompt does not force a retraction at the very next decode step.
  const int32_t reserve = table_.num_decode_rows();
  while (budget > 0 && !waiting_.empty() && req_pool_.num_free() > 0) {
    Request& r = *waiting_.begin()->request;
    const int32_t before = static_cast<int32_t>(extend_step_.size());
    if (!admit(r, budget, reserve)) break;  // head of line: nobody overtakes a blocked request
    budget -= extend_step_[static_cast<size_t>(before)].extend_len;
  }
}

int32_t Scheduler::fit_chunk(const ForwardResources& res, int32_t wanted) const {
  const int32_t slack = static_cast<int32_t>(res.pages.size()) * page_size_ - res.kv_len;
  const int32_t obtainable = kv_.available_device_pages();
  const int64_t most = static_cast<int64_t>(slack) + static_cast<int64_t>(obtainable) * page_size_;
  return static_cast<int32_t>(std::min<int64_t>(wanted, most));
}

bool Scheduler::grow_pages(ForwardResources& res, int32_t kv_target) {
  const int32_t missing = pages_for(kv_target) - static_cast<int32_t>(res.pages.size());
  if (missing <= 0) return true;
  fresh_pages_.clear();
  if (!kv_.allocate_device(missing, fresh_pages_)) return false;
  for (int32_t page : fresh_pages_) res.push_page(page);
  return true;
}

bool Scheduler::admit(Request& r, int32_t budget, int32_t reserve) {
  RadixTree& tree = kv_.tree();
  const int32_t n = r.num_tokens();
  // Match full pages only, and never the whole prompt: the last token must be computed to
  // produce logits.
  std::vector<NodeId> path;
  if (kv_.prefix_cache_enabled()) {
    const int32_t cacheable = (n - 1) / page_size_;
    r.hash_pages(cacheable, page_size_);
    path = tree.match(
        std::span<const uint64_t>(r.page_hashes).first(static_cast<size_t>(cacheable)), r.tokens);
  }
  const auto on_device =
      static_cast<size_t>(std::find_if(path.begin(), path.end(),
                                       [&](NodeId id) { return tree.node(id).device_page < 0; }) -
                          path.begin());
  const int32_t from_host = static_cast<int32_t>(path.size() - on_device);
  const int32_t cached = static_cast<int32_t>(path.size()) * page_size_;
  const NodeId deepest = path.empty() ? kRootNode : path.back();
  tree.lock_path(deepest);  // protects the match from the evictions below, on both tiers

  const int32_t obtainable = kv_.available_device_pages() - reserve - from_host;
  const int32_t chunk = std::min({n - cached, budget, std::max(0, obtainable) * page_size_});
  const int32_t slot = chunk > 0 ? req_pool_.allocate_one() : -1;
  if (slot < 0) {
    tree.unlock_path(deepest);
    return false;
  }
  fresh_pages_.clear();
  if (!kv_.allocate_device(from_host + pages_for(chunk), fresh_pages_)) {
    throw std::logic_error("admit: pages counted as available could not be allocated");
  }
  kv_.load_back(std::span<const NodeId>(path).subspan(on_device),
                std::span<const int32_t>(fresh_pages_).first(static_cast<size_t>(from_host)));
  tree.record_hits(path);

  table_.add_prefill_row(slot);
  ForwardResources res(&owners_, slot, deepest);
  for (NodeId id : path) res.push_page(tree.node(id).device_page);
  res.num_tree_pages = static_cast<int32_t>(path.size());
  for (size_t i = static_cast<size_t>(from_host); i < fresh_pages_.size(); ++i) {
    res.push_page(fresh_pages_[i]);
  }
  res.kv_len = cached;

  if (!r.admitted_once) {
    r.admitted_once = true;
    r.stats.cached_tokens = cached;
    r.stats.host_cached_tokens = from_host * page_size_;
    queried_tokens_ += n;
    hit_tokens_ += cached;
  } else {
    r.stats.preempt_ms +=
        std::chrono::duration<double, std::milli>(Request::Clock::now() - r.retracted_at).count();
  }
  waiting_.erase(key_of(r));
  running_.insert(key_of(r));
  slot_owner_[static_cast<size_t>(slot)] = &r;
  transition(r, fsm::Admit{std::move(res)});
  schedule_chunk(r, chunk);
  return true;
}

void Scheduler::schedule_chunk(Request& r, int32_t chunk) {
  ForwardResources& res = *fsm::resources_of(r.state);
  const int32_t prefix = res.kv_len;
  res.kv_len += chunk;  // computed by this plan's forward, before any later plan runs
  note_computed(r, res);
  const bool last = res.kv_len == r.num_tokens();
  extend_step_.push_back({&r, prefix, chunk, last});
  transition(r, fsm::ScheduleChunk{last});
}

Request* Scheduler::youngest_retractable() const {
  // Victim policy: the lowest-priority, latest-arriving running request whose step is not in
  // flight. Recomputing it wastes the least work, and the oldest request always progresses.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    const fsm::State& s = it->request->state;
    if (std::holds_alternative<fsm::Prefilling>(s)) return it->request;
    const auto* d = std::get_if<fsm::Decoding>(&s);
    if (d != nullptr && !d->in_flight) return it->request;
  }
  return nullptr;
}

uint64_t Scheduler::write_back_op_id() {
  if (plan_write_back_op_ == 0) plan_write_back_op_ = next_op_id_++;
  return plan_write_back_op_;
}

void Scheduler::retract(Request& r) {
  ForwardResources& res = *fsm::resources_of(r.state);
  std::optional<uint64_t> op;
  // With a host tier, save the cached path so the request resumes by load-back; the private
  // tail (less than a page plus the pending token) is recomputed.
  if (kv_.back_up_path(res.path_node)) op = write_back_op_id();
  running_.erase(key_of(r));
  slot_owner_[static_cast<size_t>(res.slot())] = nullptr;
  ++r.stats.preempt_count;
  ++preemptions_;
  r.retracted_at = Request::Clock::now();
  transition(r, fsm::Retract{op});  // releases pages, lock, row and slot
  if (op) {
    write_back_waiters_[*op].push_back(&r);
  } else {
    waiting_.insert(key_of(r));
  }
}

ExecutionPlan Scheduler::build_plan() {
  ExecutionPlan plan;
  if (auto copies = kv_.take_write_backs(); !copies.empty()) {
    WriteBackOp op{write_back_op_id(), {}, {}};
    for (const PageCopy& c : copies) {
      op.device_pages.push_back(c.src);
      op.host_pages.push_back(c.dst);
    }
    ops_in_flight_.insert(op.op_id);
    plan.cache_ops.emplace_back(std::move(op));
  }
  plan_write_back_op_ = 0;
  if (auto copies = kv_.take_load_backs(); !copies.empty()) {
    LoadBackOp op{next_op_id_++, {}, {}};
    for (const PageCopy& c : copies) {
      op.host_pages.push_back(c.src);
      op.device_pages.push_back(c.dst);
    }
    ops_in_flight_.insert(op.op_id);
    plan.cache_ops.emplace_back(std::move(op));
  }
  if (!decode_step_.empty() || !extend_step_.empty()) plan.forward = build_forward_op();
  return plan;
}

std::shared_ptr<ForwardOp> Scheduler::build_forward_op() {
  auto op = std::make_shared<ForwardOp>();
  op->forward_id = next_forward_id_++;
  op->num_decode = static_cast<int32_t>(decode_step_.size());
  op->mode = decode_step_.empty()   ? ForwardMode::kExtend
             : extend_step_.empty() ? ForwardMode::kDecode
                                    : ForwardMode::kMixed;
  last_mode_ = op->mode;
  const size_t batch = decode_step_.size() + extend_step_.size();
  op->id_offsets.reserve(batch + 1);
  op->request_pool_indices.reserve(batch);
  op->prefix_lens.reserve(batch);
  op->extend_lens.reserve(batch);
  op->seq_lens.reserve(batch);
  op->sample_mask.reserve(batch);
  op->input_ids.reserve(decode_step_.size());
  op->id_offsets.push_back(0);
  last_forward_id_ = op->forward_id;
  last_forward_reported_ = false;

  int32_t first_row = -1;
  bool contiguous = true;
  int32_t cols = 0;
  auto add = [&](const Scheduled& s, std::span<const int32_t> inputs) {
    Request& r = *s.request;
    const int32_t slot = fsm::resources_of(r.state)->slot();
    const int32_t row = table_.row_of(slot);
    const auto i = static_cast<int32_t>(op->request_pool_indices.size());
    if (first_row < 0) first_row = row;
    contiguous = contiguous && row == first_row + i;
    cols = std::max(cols, table_.row_length(row));
    op->id_chars.append(r.id);
    op->id_offsets.push_back(static_cast<int32_t>(op->id_chars.size()));
    op->request_pool_indices.push_back(slot);
    op->prefix_lens.push_back(s.prefix_len);
    op->extend_lens.push_back(s.extend_len);
    op->seq_lens.push_back(s.prefix_len + s.extend_len);
    if (inputs.size() == 1) {
      op->input_ids.push_back(inputs[0]);
    } else {
      op->input_ids.insert(op->input_ids.end(), inputs.begin(), inputs.end());
    }
    op->sample_mask.push_back(s.sample ? 1 : 0);
    if (s.sample) last_forward_sampled_.push_back(&r);
  };
  for (const Scheduled& s : decode_step_)
    add(s, std::span<const int32_t>(&s.request->tokens.back(), 1));
  for (const Scheduled& s : extend_step_) {
    add(s, std::span<const int32_t>(s.request->tokens)
               .subspan(static_cast<size_t>(s.prefix_len), static_cast<size_t>(s.extend_len)));
  }

  op->block_table_cols = cols;
  if (contiguous) {
    op->block_table_owner = table_.storage();
    op->block_table_data = table_.row_data(first_row);
    op->block_table_stride = table_.width();
    op->block_table_is_view = true;
  } else {
    auto gathered = std::make_shared<std::vector<int32_t>>(batch * static_cast<size_t>(cols), -1);
    for (size_t i = 0; i < batch; ++i) {
      const int32_t row = table_.row_of(op->request_pool_indices[i]);
      std::copy_n(table_.row_data(row), table_.row_length(row),
                  gathered->data() + i * static_cast<size_t>(cols));
    }
    op->block_table_data = gathered->data();
    op->block_table_owner = std::move(gathered);
    op->block_table_stride = cols;
  }
  return op;
}

}  // namespace tokenspeed
