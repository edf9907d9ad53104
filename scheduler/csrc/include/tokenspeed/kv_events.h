#pragma once
// KV-cache mutation events in the shape vLLM-compatible consumers read.

#include <cstdint>
#include <optional>
#include <span>
#include <variant>
#include <vector>

namespace tokenspeed {

// Which tier a block lives on; vLLM's consumers spell these "GPU" and "CPU".
enum class Medium : uint8_t { kDevice, kHost };
const char* medium_name(Medium medium);

// Consecutive full pages of one path became resident on `medium`. block_hashes[0]'s parent is
// `parent_block_hash` (nullopt for a page at the root); each later hash's parent is the one
// before it; token_ids is the pages' tokens concatenated.
struct BlockStored {
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;
  std::vector<int32_t> token_ids;
  int32_t block_size = 0;
  Medium medium = Medium::kDevice;
};

// Pages stopped being resident on `medium` (evicted or dropped).
struct BlockRemoved {
  std::vector<uint64_t> block_hashes;
  Medium medium = Medium::kDevice;
};

// Every block of every tier was dropped (prefix-cache reset).
struct AllBlocksCleared {};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// Buffer of events between two drains. Recording is a no-op when disabled, so the hot path pays
// one branch. A store that continues the chain of the previous store (or a removal following a
// removal on the same medium) is merged into it, which is how vLLM batches blocks too.
class KvEventLog {
 public:
  KvEventLog(bool enabled, int32_t block_size) : enabled_(enabled), block_size_(block_size) {}

  bool enabled() const { return enabled_; }
  void stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens,
              Medium medium);
  void removed(uint64_t hash, Medium medium);
  void cleared();
  std::vector<KvEvent> drain();

 private:
  bool enabled_;
  int32_t block_size_;
  std::vector<KvEvent> events_;
};

}  // namespace tokenspeed
