#include "tokenspeed/index_allocator.h"

#include <stdexcept>

namespace tokenspeed {

IndexAllocator::IndexAllocator(int32_t capacity, std::string what) : what_(std::move(what)) {
  if (capacity < 0) throw std::invalid_argument(what_ + ": capacity must be >= 0");
  in_use_.assign(static_cast<size_t>(capacity), 0);
  free_.reserve(static_cast<size_t>(capacity));
  // Pushed in reverse so that id 0 is handed out first (deterministic, readable in tests).
  for (int32_t id = capacity - 1; id >= 0; --id) free_.push_back(id);
}

bool IndexAllocator::is_allocated(int32_t id) const {
  return id >= 0 && id < capacity() && in_use_[static_cast<size_t>(id)] != 0;
}

bool IndexAllocator::allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0) throw std::invalid_argument(what_ + ": cannot allocate a negative count");
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    in_use_[static_cast<size_t>(id)] = 1;
    out.push_back(id);
  }
  return true;
}

int32_t IndexAllocator::allocate_one() {
  if (free_.empty()) return -1;
  const int32_t id = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(id)] = 1;
  return id;
}

void IndexAllocator::free(int32_t id) {
  if (id < 0 || id >= capacity()) {
    throw std::logic_error(what_ + ": freeing id " + std::to_string(id) + " outside [0, " +
                           std::to_string(capacity()) + ")");
  }
  if (in_use_[static_cast<size_t>(id)] == 0) {
    throw std::logic_error(what_ + ": double free of id " + std::to_string(id));
  }
  in_use_[static_cast<size_t>(id)] = 0;
  free_.push_back(id);
}

void IndexAllocator::free(std::span<const int32_t> ids) {
  for (int32_t id : ids) free(id);
}

}  // namespace tokenspeed
