#include "tokenspeed/kv_events.h"

namespace tokenspeed {

const char* medium_name(Medium medium) { return medium == Medium::kDevice ? "GPU" : "CPU"; }

void KvEventLog::stored(uint64_t hash, std::optional<uint64_t> parent,
                        std::span<const int32_t> tokens, Medium medium) {
  if (!enabled_) return;
  if (!events_.empty()) {
    auto* last = std::get_if<BlockStored>(&events_.back());
    if (last != nullptr && last->medium == medium && parent.has_value() &&
        last->block_hashes.back() == *parent) {
      last->block_hashes.push_back(hash);
      last->token_ids.insert(last->token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  events_.emplace_back(
      BlockStored{{hash}, parent, {tokens.begin(), tokens.end()}, block_size_, medium});
}

void KvEventLog::removed(uint64_t hash, Medium medium) {
  if (!enabled_) return;
  if (!events_.empty()) {
    auto* last = std::get_if<BlockRemoved>(&events_.back());
    if (last != nullptr && last->medium == medium) {
      last->block_hashes.push_back(hash);
      return;
    }
  }
  events_.emplace_back(BlockRemoved{{hash}, medium});
}

void KvEventLog::cleared() {
  if (!enabled_) return;
  events_.emplace_back(AllBlocksCleared{});
}

std::vector<KvEvent> KvEventLog::drain() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

}  // namespace tokenspeed
