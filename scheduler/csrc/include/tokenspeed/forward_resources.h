#pragma once
// What a running request holds, released by destruction.

#include <cstdint>
#include <vector>

#include "tokenspeed/block_table.h"
#include "tokenspeed/index_allocator.h"
#include "tokenspeed/kv_cache_manager.h"
#include "tokenspeed/radix_tree.h"

namespace tokenspeed {

// The scheduler's resource owners that a ForwardResources returns things to.
struct ResourceOwners {
  KvCacheManager* kv = nullptr;
  BlockTable* table = nullptr;
  ReqPoolAllocator* req_pool = nullptr;
};

// Everything a request holds while it is in the running batch: a request-pool slot and its
// block-table row, a lock on its cached prefix path in the radix tree, and its device pages.
// It lives inside the FSM states of a running request (Prefilling, PrefillDone, Decoding) and
// its destructor gives everything back, so a transition out of those states cannot leak.
//
// pages[0, num_tree_pages) are owned by the tree (the locked path root..path_node); the rest
// are private to the request: computed pages not yet published, the partial tail page, and
// pages reserved for the tokens being computed. kv_len counts the positions whose KV is (or,
// for a scheduled prefill chunk, will be by the next plan) in those pages.
class ForwardResources {
 public:
  ForwardResources(const ResourceOwners* owners, int32_t slot, NodeId locked_path);
  ForwardResources(ForwardResources&& other) noexcept;
  ForwardResources& operator=(ForwardResources&& other) noexcept;
  ForwardResources(const ForwardResources&) = delete;
  ForwardResources& operator=(const ForwardResources&) = delete;
  ~ForwardResources() { release(); }

  int32_t slot() const { return slot_; }
  int32_t num_private_pages() const { return static_cast<int32_t>(pages.size()) - num_tree_pages; }
  // Appends a private page (mirrored into the block-table row).
  void push_page(int32_t page);
  // Replaces page `index` (a duplicate of a cached page) by the cached one.
  void replace_page(int32_t index, int32_t page);

  NodeId path_node = kRootNode;
  std::vector<int32_t> pages;
  int32_t num_tree_pages = 0;
  int32_t kv_len = 0;
  bool publishing_stopped = false;  // set after a hash collision: later pages stay private

 private:
  void release() noexcept;

  const ResourceOwners* owners_ = nullptr;
  int32_t slot_ = -1;
};

}  // namespace tokenspeed
