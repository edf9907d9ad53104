#pragma once
// Block tables of the running batch, kept in forward order.

#include <cstdint>
#include <memory>
#include <vector>

namespace tokenspeed {

// One row of page ids per running request, addressed by its request-pool slot, stored so that
// a decode step's table is a zero-copy view: decode rows first ([0, num_decode_rows())), then
// prefill rows in admission order. Rows are edited in place (a page appended, a duplicate page
// swapped for the cached one), so a step costs nothing per page; a row is copied only when it
// moves (a request leaves, or its prefill completes and it joins the decode rows). Entries past
// a row's pages are -1. Removal leaves a hole and promotion is deferred until compact(), so the
// rows an earlier plan's view showed stay put until the scheduler builds the next plan.
class BlockTable {
 public:
  BlockTable(int32_t max_rows, int32_t width);

  int32_t width() const { return width_; }
  int32_t num_rows() const { return num_rows_; }
  int32_t num_decode_rows() const { return num_decode_; }

  void add_prefill_row(int32_t slot);
  void remove(int32_t slot);
  void mark_decoding(int32_t slot);
  // Fills holes and moves rows marked decoding into the decode region; prefill rows keep their
  // order.
  void compact();

  void push_page(int32_t slot, int32_t page);
  void set_page(int32_t slot, int32_t index, int32_t page);

  int32_t row_of(int32_t slot) const { return slot_row_[static_cast<size_t>(slot)]; }
  int32_t slot_at(int32_t row) const { return row_slot_[static_cast<size_t>(row)]; }
  int32_t row_length(int32_t row) const { return row_len_[static_cast<size_t>(row)]; }
  const int32_t* row_data(int32_t row) const {
    return data_->data() + static_cast<size_t>(row) * static_cast<size_t>(width_);
  }
  // The backing memory; views handed to Python keep it alive.
  std::shared_ptr<const std::vector<int32_t>> storage() const { return data_; }

 private:
  int32_t* row_ptr(int32_t row) {
    return data_->data() + static_cast<size_t>(row) * static_cast<size_t>(width_);
  }
  void move_row(int32_t from, int32_t to);
  void clear_row(int32_t row);
  void compact_prefill_region(int32_t decode_live, int32_t old_decode);

  int32_t max_rows_;
  int32_t width_;
  std::shared_ptr<std::vector<int32_t>> data_;
  std::vector<int32_t> row_len_;
  std::vector<int32_t> row_slot_;  // slot of each row, -1 for a hole
  std::vector<int32_t> slot_row_;  // row of each slot, -1 when the slot has none
  std::vector<uint8_t> promote_;   // per slot: move to the decode region at compact()
  int32_t num_rows_ = 0;
  int32_t num_decode_ = 0;
  bool dirty_ = false;  // a hole or a promotion is pending
  struct Parked {
    int32_t slot;
    int32_t offset;
    int32_t length;
  };
  std::vector<int32_t> scratch_;
  std::vector<Parked> parked_;
};

}  // namespace tokenspeed
