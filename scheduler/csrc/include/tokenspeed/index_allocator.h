#pragma once
// Free lists of integer ids: device pages, host pages and request-pool slots.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tokenspeed {

// Hands out the ids [0, capacity) in O(1). A double free or a foreign id throws instead of
// corrupting the free list, because a page handed to two owners would silently mix two
// requests' KV.
class IndexAllocator {
 public:
  IndexAllocator(int32_t capacity, std::string what);

  int32_t capacity() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return capacity() - num_free(); }
  bool is_allocated(int32_t id) const;

  // Appends `n` ids to `out`; when fewer than `n` are free, appends nothing and returns false.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  // One id, or -1 when none is free.
  int32_t allocate_one();
  void free(int32_t id);
  void free(std::span<const int32_t> ids);
  // Every free id, for ownership checks.
  std::vector<int32_t> free_ids() const { return free_; }

 private:
  std::string what_;
  std::vector<int32_t> free_;  // a stack: the most recently freed id is reused first
  std::vector<uint8_t> in_use_;
};

// Device and host KV pages.
using PageAllocator = IndexAllocator;
// Slots of the request pool: a running request's index into per-request runtime state.
using ReqPoolAllocator = IndexAllocator;

}  // namespace tokenspeed
