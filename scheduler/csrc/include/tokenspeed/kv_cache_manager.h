#pragma once
// Every KV page of both tiers, and the policy that moves and reclaims them.

#include <cstdint>
#include <span>
#include <vector>

#include "tokenspeed/index_allocator.h"
#include "tokenspeed/kv_events.h"
#include "tokenspeed/radix_tree.h"

namespace tokenspeed {

// A page copy between tiers that a plan asks the executor to perform.
struct PageCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

// Owns the device and host page allocators and the radix prefix cache over them, and decides
// eviction:
//  - only unlocked pages are reclaimed, leaves first, least recently used first;
//  - device pages whose content is also on the host go first (dropping them costs nothing);
//  - a device page without a host copy is written back to the host on its way out when there is
//    a host tier (making room there by evicting the host's LRU leaves), else dropped.
// Copies are queued here while a plan is built and handed to the plan at its end. The executor
// runs a plan's write-backs, then its load-backs, before its forward, so a device page freed
// by a write-back may be reused by the very same plan.
class KvCacheManager {
 public:
  KvCacheManager(int32_t page_size, int32_t device_pages, int32_t host_pages, bool prefix_cache,
                 KvEventLog* events);

  int32_t page_size() const { return page_size_; }
  bool prefix_cache_enabled() const { return prefix_cache_; }
  bool has_host_tier() const { return host_.capacity() > 0; }
  void set_tick(uint64_t tick) { tree_.set_tick(tick); }

  RadixTree& tree() { return tree_; }
  const RadixTree& tree() const { return tree_; }
  const PageAllocator& device() const { return device_; }
  const PageAllocator& host() const { return host_; }

  // Pages that are free or held only by the cache (unlocked), i.e. obtainable right now.
  int32_t evictable_device_pages() const {
    return tree_.device_pages() - tree_.locked_device_pages();
  }
  int32_t available_device_pages() const { return device_.num_free() + evictable_device_pages(); }

  // Appends `n` device pages to `out`, evicting cached pages as needed. Returns false (and
  // allocates nothing) when fewer than `n` are available.
  bool allocate_device(int32_t n, std::vector<int32_t>& out);
  void free_device(std::span<const int32_t> pages) { device_.free(pages); }
  void free_device(int32_t page) { device_.free(page); }

  // Reclaims up to `n` device (resp. host) pages into the free list; returns how many.
  int32_t evict_device(int32_t n);
  int32_t evict_host(int32_t n);

  // Queues write-backs so that the pages of the path root..`deepest` get host copies, top
  // down, stopping at the first page the host cannot take. Returns whether anything was queued.
  bool back_up_path(NodeId deepest);
  // Gives the host-only nodes of a matched path the device pages `targets` (same order) and
  // queues their load-backs.
  void load_back(std::span<const NodeId> nodes, std::span<const int32_t> targets);

  std::vector<PageCopy> take_write_backs();
  std::vector<PageCopy> take_load_backs();
  bool has_pending_copies() const { return !write_backs_.empty() || !load_backs_.empty(); }

  // Drops the whole cache (both tiers) when nothing is locked; false otherwise.
  bool reset();

 private:
  // A host page for a copy of `id`, whose parent must keep its host copy meanwhile; -1 if none.
  int32_t host_page_for(NodeId id);

  int32_t page_size_;
  bool prefix_cache_;
  PageAllocator device_;
  PageAllocator host_;
  RadixTree tree_;
  std::vector<PageCopy> write_backs_;  // device -> host
  std::vector<PageCopy> load_backs_;   // host -> device
};

}  // namespace tokenspeed
