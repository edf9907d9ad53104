#include <gtest/gtest.h>

#include "tokenspeed/index_allocator.h"

using tokenspeed::IndexAllocator;

TEST(IndexAllocator, AllocatesEveryIdOnceInOrder) {
  IndexAllocator a(4, "pages");
  std::vector<int32_t> out;
  ASSERT_TRUE(a.allocate(4, out));
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.allocate_one(), -1);
}

TEST(IndexAllocator, AllOrNothing) {
  IndexAllocator a(3, "pages");
  std::vector<int32_t> out;
  EXPECT_FALSE(a.allocate(4, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(a.num_free(), 3);
}

TEST(IndexAllocator, FreedIdsAreReused) {
  IndexAllocator a(2, "pages");
  const int32_t x = a.allocate_one();
  a.free(x);
  EXPECT_FALSE(a.is_allocated(x));
  EXPECT_EQ(a.allocate_one(), x);
  EXPECT_TRUE(a.is_allocated(x));
  EXPECT_EQ(a.num_used(), 1);
}

TEST(IndexAllocator, DoubleFreeAndForeignIdsThrow) {
  IndexAllocator a(2, "pages");
  const int32_t x = a.allocate_one();
  a.free(x);
  EXPECT_THROW(a.free(x), std::logic_error);
  EXPECT_THROW(a.free(5), std::logic_error);
  EXPECT_THROW(a.free(-1), std::logic_error);
  EXPECT_EQ(a.num_free(), 2);
}

TEST(IndexAllocator, ZeroCapacityIsValid) {
  IndexAllocator a(0, "host pages");
  EXPECT_EQ(a.allocate_one(), -1);
  std::vector<int32_t> out;
  EXPECT_TRUE(a.allocate(0, out));
}
