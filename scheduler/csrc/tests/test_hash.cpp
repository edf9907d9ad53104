#include <gtest/gtest.h>

#include "tokenspeed/hash.h"

using tokenspeed::hash_page;
using tokenspeed::rolling_hash;

TEST(RollingHash, OnlyFullPagesAreHashed) {
  std::vector<int32_t> t{1, 2, 3, 4, 5};
  EXPECT_EQ(rolling_hash(t, 2).size(), 2u);
  EXPECT_TRUE(rolling_hash(std::vector<int32_t>{1}, 2).empty());
}

TEST(RollingHash, HashesChainThroughParents) {
  std::vector<int32_t> a{1, 2, 3, 4}, b{9, 9, 3, 4};
  auto ha = rolling_hash(a, 2), hb = rolling_hash(b, 2);
  EXPECT_NE(ha[1], hb[1]);  // same second page, different parent
  std::vector<int32_t> tail{3, 4};
  EXPECT_EQ(rolling_hash(tail, 2, ha[0])[0], ha[1]);
  EXPECT_EQ(hash_page(ha[0], tail), ha[1]);
}

TEST(RollingHash, SensitiveToOrderAndValues) {
  std::vector<int32_t> a{1, 2, 3}, b{2, 1, 3}, c{1, 2, 4};
  EXPECT_NE(hash_page(0, a), hash_page(0, b));
  EXPECT_NE(hash_page(0, a), hash_page(0, c));
  EXPECT_EQ(hash_page(7, a), hash_page(7, a));
}

TEST(RollingHash, RejectsNonPositivePageSize) {
  EXPECT_THROW(rolling_hash(std::vector<int32_t>{1}, 0), std::invalid_argument);
}
