#pragma once
// Flat hash index from block hash to radix-tree node.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tokenspeed {

// Open addressing with linear probing and backward-shift deletion. The keys are already
// well-mixed 64-bit block hashes, so the low bits pick the slot; one lookup is usually one cache
// line, and there is no per-entry allocation (std::unordered_map costs two misses and a malloc
// per insert, which showed up at every page a decode step completes).
class BlockIndex {
 public:
  // Sized once for `max_entries` (the tree's node bound), at most 3/4 full.
  explicit BlockIndex(int32_t max_entries);

  int32_t find(uint64_t key) const;          // the value, or -1
  void insert(uint64_t key, int32_t value);  // the key must be absent
  void erase(uint64_t key);                  // no-op when absent
  void clear();
  int32_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;
    int32_t value = -1;  // -1: empty
  };
  size_t home(uint64_t key) const { return static_cast<size_t>(key) & mask_; }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int32_t size_ = 0;
};

}  // namespace tokenspeed
