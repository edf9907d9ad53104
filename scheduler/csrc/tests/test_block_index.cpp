#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "tokenspeed/block_index.h"

using tokenspeed::BlockIndex;

TEST(BlockIndex, FindInsertErase) {
  BlockIndex index(8);
  EXPECT_EQ(index.find(42), -1);
  index.insert(42, 7);
  EXPECT_EQ(index.find(42), 7);
  EXPECT_THROW(index.insert(42, 8), std::logic_error);
  index.erase(42);
  index.erase(42);  // absent: no-op
  EXPECT_EQ(index.find(42), -1);
  EXPECT_EQ(index.size(), 0);
}

TEST(BlockIndex, MatchesAReferenceMapUnderCollidingKeys) {
  // Keys share their low bits in small groups, so probe runs wrap and interleave and erase
  // has to shift entries back across them.
  BlockIndex index(64);
  std::unordered_map<uint64_t, int32_t> reference;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const uint64_t key = (rng() % 24) * 1024 + (rng() % 3) * 29;  // 72 distinct keys
    const bool present = reference.contains(key);
    if (!present && reference.size() < 64 && rng() % 2 == 0) {
      index.insert(key, step);
      reference[key] = step;
    } else if (present) {
      index.erase(key);
      reference.erase(key);
    }
    ASSERT_EQ(index.size(), static_cast<int32_t>(reference.size()));
    for (const auto& [k, v] : reference) ASSERT_EQ(index.find(k), v) << "step " << step;
  }
}

TEST(BlockIndex, RefusesToGrowPastItsBound) {
  BlockIndex index(4);  // 16 slots, at most 12 entries
  for (uint64_t k = 0; k < 12; ++k) index.insert(k, 0);
  EXPECT_THROW(index.insert(99, 0), std::logic_error);
  index.clear();
  EXPECT_EQ(index.find(3), -1);
}
