#include "tokenspeed/block_table.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tokenspeed {

BlockTable::BlockTable(int32_t max_rows, int32_t width)
    : max_rows_(max_rows),
      width_(width),
      data_(std::make_shared<std::vector<int32_t>>(
          static_cast<size_t>(max_rows) * static_cast<size_t>(width), -1)),
      row_len_(static_cast<size_t>(max_rows), 0),
      row_slot_(static_cast<size_t>(max_rows), -1),
      slot_row_(static_cast<size_t>(max_rows), -1),
      promote_(static_cast<size_t>(max_rows), 0) {}

void BlockTable::add_prefill_row(int32_t slot) {
  if (num_rows_ >= max_rows_) throw std::logic_error("block table: no free row (compact first)");
  if (slot_row_[static_cast<size_t>(slot)] >= 0) {
    throw std::logic_error("block table: slot " + std::to_string(slot) + " already has a row");
  }
  const int32_t row = num_rows_++;
  row_slot_[static_cast<size_t>(row)] = slot;
  row_len_[static_cast<size_t>(row)] = 0;
  slot_row_[static_cast<size_t>(slot)] = row;
  promote_[static_cast<size_t>(slot)] = 0;
}

void BlockTable::remove(int32_t slot) {
  const int32_t row = row_of(slot);
  if (row < 0) throw std::logic_error("block table: removing a slot without a row");
  row_slot_[static_cast<size_t>(row)] = -1;
  slot_row_[static_cast<size_t>(slot)] = -1;
  promote_[static_cast<size_t>(slot)] = 0;
  dirty_ = true;
}

void BlockTable::mark_decoding(int32_t slot) {
  const int32_t row = row_of(slot);
  if (row < 0) throw std::logic_error("block table: promoting a slot without a row");
  if (row < num_decode_) return;
  promote_[static_cast<size_t>(slot)] = 1;
  dirty_ = true;
}

void BlockTable::push_page(int32_t slot, int32_t page) {
  const int32_t row = row_of(slot);
  int32_t& len = row_len_[static_cast<size_t>(row)];
  if (len >= width_) throw std::logic_error("block table: row is full");
  row_ptr(row)[len++] = page;
}

void BlockTable::set_page(int32_t slot, int32_t index, int32_t page) {
  const int32_t row = row_of(slot);
  if (index < 0 || index >= row_len_[static_cast<size_t>(row)]) {
    throw std::logic_error("block table: set_page index out of range");
  }
  row_ptr(row)[index] = page;
}

void BlockTable::clear_row(int32_t row) {
  int32_t& len = row_len_[static_cast<size_t>(row)];
  std::fill_n(row_ptr(row), len, -1);
  len = 0;
  row_slot_[static_cast<size_t>(row)] = -1;
}

void BlockTable::move_row(int32_t from, int32_t to) {
  const int32_t from_len = row_len_[static_cast<size_t>(from)];
  const int32_t to_len = row_len_[static_cast<size_t>(to)];
  std::copy_n(row_ptr(from), from_len, row_ptr(to));
  if (to_len > from_len) std::fill_n(row_ptr(to) + from_len, to_len - from_len, -1);
  row_len_[static_cast<size_t>(to)] = from_len;
  const int32_t slot = row_slot_[static_cast<size_t>(from)];
  row_slot_[static_cast<size_t>(to)] = slot;
  if (slot >= 0) slot_row_[static_cast<size_t>(slot)] = to;
  clear_row(from);
}

void BlockTable::compact() {
  if (!dirty_) return;
  dirty_ = false;
  // Decode region: order does not matter, so fill each hole with the last live row.
  const int32_t old_decode = num_decode_;
  int32_t lo = 0;
  int32_t hi = old_decode - 1;
  for (;;) {
    while (lo <= hi && row_slot_[static_cast<size_t>(lo)] >= 0) ++lo;
    while (hi >= lo && row_slot_[static_cast<size_t>(hi)] < 0) clear_row(hi--);
    if (lo >= hi) break;
    move_row(hi--, lo++);
  }
  compact_prefill_region(lo, old_decode);
}

void BlockTable::compact_prefill_region(int32_t decode_live, int32_t old_decode) {
  // Park every live prefill row (usually a handful), then lay them out again: promoted rows
  // right after the live decode rows, the others after them in their original order.
  scratch_.clear();
  parked_.clear();
  int32_t promoted = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t row = old_decode; row < num_rows_; ++row) {
      const int32_t slot = row_slot_[static_cast<size_t>(row)];
      if (slot < 0 || (promote_[static_cast<size_t>(slot)] != 0) != (pass == 0)) continue;
      const int32_t len = row_len_[static_cast<size_t>(row)];
      parked_.push_back({slot, static_cast<int32_t>(scratch_.size()), len});
      scratch_.insert(scratch_.end(), row_ptr(row), row_ptr(row) + len);
      promoted += pass == 0;
    }
  }
  for (int32_t row = old_decode; row < num_rows_; ++row) clear_row(row);
  for (int32_t row = decode_live; row < old_decode; ++row) clear_row(row);
  int32_t row = decode_live;
  for (const Parked& p : parked_) {
    std::copy_n(scratch_.data() + p.offset, p.length, row_ptr(row));
    row_len_[static_cast<size_t>(row)] = p.length;
    row_slot_[static_cast<size_t>(row)] = p.slot;
    slot_row_[static_cast<size_t>(p.slot)] = row;
    promote_[static_cast<size_t>(p.slot)] = 0;
    ++row;
  }
  num_decode_ = decode_live + promoted;
  num_rows_ = row;
}

}  // namespace tokenspeed
