#include "tokenspeed/block_index.h"

#include <stdexcept>

namespace tokenspeed {

BlockIndex::BlockIndex(int32_t max_entries) {
  size_t capacity = 16;
  while (capacity * 3 < static_cast<size_t>(max_entries) * 4 + 4) capacity *= 2;
  slots_.resize(capacity);
  mask_ = capacity - 1;
}

int32_t BlockIndex::find(uint64_t key) const {
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.value < 0) return -1;
    if (s.key == key) return s.value;
  }
}

void BlockIndex::insert(uint64_t key, int32_t value) {
  if (static_cast<size_t>(size_ + 1) * 4 > slots_.size() * 3) {
    throw std::logic_error("block index: over capacity");
  }
  size_t i = home(key);
  while (slots_[i].value >= 0) {
    if (slots_[i].key == key) throw std::logic_error("block index: duplicate key");
    i = (i + 1) & mask_;
  }
  slots_[i] = {key, value};
  ++size_;
}

void BlockIndex::erase(uint64_t key) {
  size_t i = home(key);
  while (slots_[i].value >= 0 && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].value < 0) return;
  // Backward shift: pull later entries of the probe run into the hole, so lookups never need
  // tombstones.
  size_t hole = i;
  for (size_t j = (hole + 1) & mask_; slots_[j].value >= 0; j = (j + 1) & mask_) {
    const size_t want = home(slots_[j].key);
    // Move j into the hole unless its home lies cyclically in (hole, j].
    const bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
}

void BlockIndex::clear() {
  for (Slot& s : slots_) s = Slot{};
  size_ = 0;
}

}  // namespace tokenspeed
