#include <gtest/gtest.h>

#include "tokenspeed/hash.h"
#include "tokenspeed/kv_cache_manager.h"
#include "tokenspeed/radix_tree.h"

using namespace tokenspeed;

namespace {

constexpr int32_t kPage = 2;

// Inserts the full pages of `tokens` on the device, pages taken from `next_page` onwards, and
// returns the deepest node.
NodeId insert_all(RadixTree& tree, const std::vector<int32_t>& tokens, int32_t& next_page) {
  const auto hashes = rolling_hash(tokens, kPage);
  NodeId parent = kRootNode;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto page = std::span<const int32_t>(tokens).subspan(i * kPage, kPage);
    const auto ins = tree.insert(parent, hashes[i], page, next_page);
    if (ins.device_page == next_page) ++next_page;
    parent = ins.node;
  }
  return parent;
}

std::vector<NodeId> match(const RadixTree& tree, const std::vector<int32_t>& tokens) {
  const auto hashes = rolling_hash(tokens, kPage);
  return tree.match(hashes, tokens);
}

}  // namespace

TEST(RadixTree, MatchesFullPagesOfTheLongestCachedPrefix) {
  KvEventLog events(true, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  insert_all(tree, {1, 2, 3, 4, 5, 6}, next);
  EXPECT_EQ(match(tree, {1, 2, 3, 4, 9, 9}).size(), 2u);
  EXPECT_EQ(match(tree, {1, 2, 3, 4, 5, 6, 7, 8}).size(), 3u);
  EXPECT_EQ(match(tree, {1, 2, 3}).size(), 1u);  // the partial page never matches
  EXPECT_TRUE(match(tree, {2, 1}).empty());
  tree.check_invariants();
}

TEST(RadixTree, SharedPrefixesShareNodesAndDuplicatesReturnTheCachedPage) {
  KvEventLog events(true, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  insert_all(tree, {1, 2, 3, 4}, next);
  insert_all(tree, {1, 2, 7, 7}, next);
  EXPECT_EQ(tree.num_nodes(), 3);
  EXPECT_EQ(next, 3);  // the second insert reused page 0 for [1, 2]
  const auto hashes = rolling_hash(std::vector<int32_t>{1, 2}, kPage);
  const std::vector<int32_t> page{1, 2};
  const auto dup = tree.insert(kRootNode, hashes[0], page, 42);
  EXPECT_EQ(dup.device_page, 0);
  tree.check_invariants();
}

TEST(RadixTree, HashCollisionIsRefused) {
  KvEventLog events(false, kPage);
  RadixTree tree(kPage, 4, &events);
  const std::vector<int32_t> a{1, 2}, b{3, 4};
  ASSERT_NE(tree.insert(kRootNode, 77, a, 0).node, kNoNode);
  EXPECT_EQ(tree.insert(kRootNode, 77, b, 1).node, kNoNode);  // same key, other tokens
  const std::vector<uint64_t> key{77};
  EXPECT_TRUE(tree.match(key, b).empty());
}

TEST(RadixTree, LocksCoverWholePathsAndBlockEviction) {
  KvEventLog events(false, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  const NodeId deep = insert_all(tree, {1, 2, 3, 4, 5, 6}, next);
  tree.lock_path(deep);
  EXPECT_EQ(tree.locked_device_pages(), 3);
  EXPECT_EQ(tree.lru_device_leaf(false), kNoNode);
  tree.unlock_path(deep);
  EXPECT_EQ(tree.locked_device_pages(), 0);
  EXPECT_EQ(tree.lru_device_leaf(false), deep);  // only leaves are candidates
  tree.check_invariants();
}

TEST(RadixTree, EvictionIsLeastRecentlyUsedFirst) {
  KvEventLog events(false, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  tree.set_tick(1);
  const NodeId a = insert_all(tree, {1, 1}, next);
  tree.set_tick(2);
  const NodeId b = insert_all(tree, {2, 2}, next);
  tree.set_tick(3);
  tree.lock_path(a);  // touching a makes b the least recently used
  tree.unlock_path(a);
  EXPECT_EQ(tree.lru_device_leaf(false), b);
  tree.detach_device_page(b);
  EXPECT_EQ(tree.lru_device_leaf(false), a);
  EXPECT_EQ(tree.num_nodes(), 1);
  tree.check_invariants();
}

TEST(RadixTree, HostTierKeepsNodesAndEvictsSeparately) {
  KvEventLog events(true, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  const NodeId leaf = insert_all(tree, {1, 2, 3, 4}, next);
  const NodeId root_child = tree.node(leaf).parent;
  EXPECT_THROW(tree.attach_host_page(leaf, 0), std::logic_error);  // parent not on the host
  tree.attach_host_page(root_child, 0);
  tree.attach_host_page(leaf, 1);
  EXPECT_EQ(tree.lru_device_leaf(true), leaf);  // backed leaves go first
  tree.detach_device_page(leaf);
  EXPECT_EQ(tree.node(leaf).host_page, 1);  // still cached on the host
  EXPECT_EQ(tree.lru_host_leaf(), leaf);
  const auto m = match(tree, {1, 2, 3, 4});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_GE(tree.node(m[0]).device_page, 0);
  EXPECT_LT(tree.node(m[1]).device_page, 0);  // host-only part comes after the device part
  tree.attach_device_page(leaf, 9);           // a load-back
  EXPECT_EQ(tree.node(leaf).device_page, 9);
  tree.check_invariants();
  tree.detach_host_page(leaf);
  tree.detach_host_page(root_child);
  EXPECT_EQ(tree.host_pages(), 0);
  EXPECT_EQ(tree.device_pages(), 2);
  tree.check_invariants();
}

TEST(RadixTree, EventsReplayToTheDeviceBlocks) {
  KvEventLog events(true, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  insert_all(tree, {1, 2, 3, 4}, next);
  const NodeId leaf = insert_all(tree, {1, 2, 5, 6}, next);
  tree.detach_device_page(leaf);
  const auto drained = events.drain();
  ASSERT_EQ(drained.size(), 3u);
  const auto& first = std::get<BlockStored>(drained[0]);
  EXPECT_EQ(first.block_hashes.size(), 2u);  // a chain is one event
  EXPECT_FALSE(first.parent_block_hash.has_value());
  EXPECT_EQ(first.token_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  const auto& second = std::get<BlockStored>(drained[1]);
  EXPECT_EQ(second.parent_block_hash, first.block_hashes[0]);
  const auto& removed = std::get<BlockRemoved>(drained[2]);
  EXPECT_EQ(removed.block_hashes, second.block_hashes);
  EXPECT_TRUE(events.drain().empty());
}

TEST(RadixTree, SnapshotMergesChains) {
  KvEventLog events(false, kPage);
  RadixTree tree(kPage, 16, &events);
  int32_t next = 0;
  insert_all(tree, {1, 2, 3, 4, 5, 6}, next);
  insert_all(tree, {1, 2, 3, 4, 7, 8}, next);
  const CacheSnapshot snap = tree.snapshot(10);
  ASSERT_EQ(snap.nodes.size(), 4u);  // root, [1 2 3 4], [5 6], [7 8]
  EXPECT_EQ(snap.nodes[1].token_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(snap.nodes[1].device_pages, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(snap.nodes[2].parent_id, snap.nodes[1].id);
  EXPECT_EQ(snap.nodes[2].prefix_len, 4);
  EXPECT_FALSE(snap.truncated);
  EXPECT_TRUE(tree.snapshot(2).truncated);
}

// --- KvCacheManager: eviction policy ---------------------------------------------------------

TEST(KvCacheManager, AllocationEvictsUnlockedCachedPages) {
  KvEventLog events(false, kPage);
  KvCacheManager kv(kPage, 4, 0, true, &events);
  std::vector<int32_t> pages;
  ASSERT_TRUE(kv.allocate_device(3, pages));
  const std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6};
  const auto hashes = rolling_hash(tokens, kPage);
  NodeId parent = kRootNode;
  for (int i = 0; i < 3; ++i) {
    parent = kv.tree()
                 .insert(parent, hashes[i], std::span(tokens).subspan(i * kPage, kPage), pages[i])
                 .node;
  }
  kv.tree().lock_path(kv.tree().node(parent).parent);  // the first two pages are in use
  EXPECT_EQ(kv.available_device_pages(), 2);
  std::vector<int32_t> more;
  EXPECT_FALSE(kv.allocate_device(3, more));
  ASSERT_TRUE(kv.allocate_device(2, more));  // evicts the unlocked leaf
  EXPECT_EQ(kv.tree().num_nodes(), 2);
  EXPECT_EQ(kv.available_device_pages(), 0);
  kv.tree().check_invariants();
}

TEST(KvCacheManager, EvictionWritesBackToTheHostAndPrefersBackedPages) {
  KvEventLog events(false, kPage);
  KvCacheManager kv(kPage, 3, 2, true, &events);
  std::vector<int32_t> pages;
  ASSERT_TRUE(kv.allocate_device(3, pages));
  const std::vector<int32_t> a{1, 1}, b{2, 2}, c{3, 3};
  kv.set_tick(1);
  const NodeId na = kv.tree().insert(kRootNode, 11, a, pages[0]).node;
  kv.set_tick(2);
  const NodeId nb = kv.tree().insert(kRootNode, 22, b, pages[1]).node;
  kv.set_tick(3);
  const NodeId nc = kv.tree().insert(kRootNode, 33, c, pages[2]).node;
  ASSERT_TRUE(kv.back_up_path(nc));  // c is backed up already: evicted first although newest
  EXPECT_EQ(kv.take_write_backs().size(), 1u);
  EXPECT_EQ(kv.evict_device(1), 1);
  EXPECT_LT(kv.tree().node(nc).device_page, 0);
  EXPECT_TRUE(kv.take_write_backs().empty());
  // a is unbacked and least recently used: written back to the last free host page.
  EXPECT_EQ(kv.evict_device(1), 1);
  const auto copies = kv.take_write_backs();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, pages[0]);
  EXPECT_EQ(kv.tree().node(na).host_page, copies[0].dst);
  // The host is full now: backing up b evicts the host's LRU leaf (a, tick 1).
  EXPECT_EQ(kv.evict_device(1), 1);
  EXPECT_EQ(kv.take_write_backs().size(), 1u);
  EXPECT_GE(kv.tree().node(nb).host_page, 0);
  EXPECT_GE(kv.tree().node(nc).host_page, 0);
  EXPECT_EQ(kv.tree().device_pages(), 0);
  EXPECT_EQ(kv.tree().host_pages(), 2);
  EXPECT_EQ(kv.device().num_free(), 3);
  kv.tree().check_invariants();
}

TEST(KvCacheManager, BackUpAndLoadBackAPath) {
  KvEventLog events(false, kPage);
  KvCacheManager kv(kPage, 4, 4, true, &events);
  std::vector<int32_t> pages;
  ASSERT_TRUE(kv.allocate_device(2, pages));
  const std::vector<int32_t> tokens{1, 2, 3, 4};
  const auto hashes = rolling_hash(tokens, kPage);
  const NodeId first =
      kv.tree().insert(kRootNode, hashes[0], std::span(tokens).first(2), pages[0]).node;
  const NodeId second =
      kv.tree().insert(first, hashes[1], std::span(tokens).last(2), pages[1]).node;
  EXPECT_TRUE(kv.back_up_path(second));
  EXPECT_EQ(kv.take_write_backs().size(), 2u);
  EXPECT_FALSE(kv.back_up_path(second));  // already on the host
  EXPECT_EQ(kv.evict_device(2), 2);
  EXPECT_TRUE(kv.take_write_backs().empty());  // backed pages leave without a copy
  const auto path = kv.tree().match(hashes, tokens);
  ASSERT_EQ(path.size(), 2u);
  kv.tree().lock_path(path.back());
  std::vector<int32_t> targets;
  ASSERT_TRUE(kv.allocate_device(2, targets));
  kv.load_back(path, targets);
  const auto loads = kv.take_load_backs();
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].dst, targets[0]);
  EXPECT_EQ(kv.tree().node(second).device_page, targets[1]);
  kv.tree().check_invariants();
}

TEST(KvCacheManager, ResetDropsEverythingUnlessLocked) {
  KvEventLog events(true, kPage);
  KvCacheManager kv(kPage, 2, 0, true, &events);
  std::vector<int32_t> pages;
  ASSERT_TRUE(kv.allocate_device(1, pages));
  const std::vector<int32_t> a{1, 1};
  const NodeId n = kv.tree().insert(kRootNode, 5, a, pages[0]).node;
  kv.tree().lock_path(n);
  EXPECT_FALSE(kv.reset());
  kv.tree().unlock_path(n);
  EXPECT_TRUE(kv.reset());
  EXPECT_EQ(kv.device().num_free(), 2);
  EXPECT_EQ(kv.tree().num_nodes(), 0);
  const auto drained = events.drain();
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(drained.back()));
}
