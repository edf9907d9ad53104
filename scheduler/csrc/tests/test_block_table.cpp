#include <gtest/gtest.h>

#include "tokenspeed/block_table.h"

using tokenspeed::BlockTable;

namespace {
std::vector<int32_t> row(const BlockTable& t, int32_t r) {
  return {t.row_data(r), t.row_data(r) + t.width()};
}
}  // namespace

TEST(BlockTable, RowsArePaddedWithMinusOne) {
  BlockTable t(4, 3);
  t.add_prefill_row(2);
  t.push_page(2, 7);
  EXPECT_EQ(row(t, 0), (std::vector<int32_t>{7, -1, -1}));
  t.set_page(2, 0, 9);
  EXPECT_EQ(row(t, 0), (std::vector<int32_t>{9, -1, -1}));
  EXPECT_THROW(t.set_page(2, 1, 1), std::logic_error);
}

TEST(BlockTable, PromotionMovesRowsToTheDecodeRegionKeepingPrefillOrder) {
  BlockTable t(4, 3);
  for (int32_t slot : {0, 1, 2}) {
    t.add_prefill_row(slot);
    t.push_page(slot, 10 + slot);
  }
  t.mark_decoding(1);
  // Nothing moves before compact(): an earlier view stays valid.
  EXPECT_EQ(t.row_of(1), 1);
  t.compact();
  EXPECT_EQ(t.num_decode_rows(), 1);
  EXPECT_EQ(t.slot_at(0), 1);
  EXPECT_EQ(t.slot_at(1), 0);
  EXPECT_EQ(t.slot_at(2), 2);
  EXPECT_EQ(row(t, 0), (std::vector<int32_t>{11, -1, -1}));
}

TEST(BlockTable, RemovalFillsHolesAndClearsRows) {
  BlockTable t(4, 2);
  for (int32_t slot : {0, 1, 2, 3}) {
    t.add_prefill_row(slot);
    t.push_page(slot, slot);
    t.push_page(slot, 100 + slot);
    t.mark_decoding(slot);
  }
  t.compact();
  ASSERT_EQ(t.num_decode_rows(), 4);
  t.remove(t.slot_at(0));
  t.remove(t.slot_at(3));
  t.compact();
  EXPECT_EQ(t.num_decode_rows(), 2);
  EXPECT_EQ(t.num_rows(), 2);
  for (int32_t r = 0; r < 2; ++r) {
    const int32_t slot = t.slot_at(r);
    EXPECT_EQ(row(t, r), (std::vector<int32_t>{slot, 100 + slot}));
  }
  for (int32_t r = 2; r < 4; ++r) EXPECT_EQ(row(t, r), (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(t.row_of(0), -1);
  // The freed slot can get a row again.
  t.add_prefill_row(0);
  EXPECT_EQ(t.row_of(0), 2);
}

TEST(BlockTable, MixedHolesAndPromotions) {
  BlockTable t(6, 2);
  for (int32_t slot = 0; slot < 6; ++slot) {
    t.add_prefill_row(slot);
    t.push_page(slot, slot);
  }
  t.mark_decoding(0);
  t.mark_decoding(1);
  t.compact();  // decode: 0 1; prefill: 2 3 4 5
  t.remove(0);
  t.remove(3);
  t.mark_decoding(4);
  t.compact();
  EXPECT_EQ(t.num_decode_rows(), 2);
  EXPECT_EQ(t.num_rows(), 4);
  std::vector<int32_t> slots;
  for (int32_t r = 0; r < t.num_rows(); ++r) {
    slots.push_back(t.slot_at(r));
    EXPECT_EQ(row(t, r)[0], t.slot_at(r));
  }
  EXPECT_EQ(slots, (std::vector<int32_t>{1, 4, 2, 5}));
}
