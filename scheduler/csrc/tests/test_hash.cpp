#include <gtest/gtest.h>

#include "tokenspeed/hash.h"

TEST(RollingHash, OnlyFullPagesAreHashed) {
  std::vector<int32_t> t{1, 2, 3, 4, 5};
  EXPECT_EQ(tokenspeed::rolling_hash(t, 2).size(), 2u);
}

TEST(RollingHash, HashesChainThroughParents) {
  std::vector<int32_t> a{1, 2, 3, 4}, b{9, 9, 3, 4};
  auto ha = tokenspeed::rolling_hash(a, 2), hb = tokenspeed::rolling_hash(b, 2);
  EXPECT_NE(ha[1], hb[1]);  // same second page, different parent
  std::vector<int32_t> tail{3, 4};
  EXPECT_EQ(tokenspeed::rolling_hash(tail, 2, ha[0])[0], ha[1]);
}
