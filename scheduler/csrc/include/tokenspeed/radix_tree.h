#pragma once
// Page-granular radix tree: the prefix cache over the device and host tiers.

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "tokenspeed/block_index.h"
#include "tokenspeed/kv_events.h"

namespace tokenspeed {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;
inline constexpr NodeId kRootNode = 0;

// One full page of tokens. A node exists only while it holds a page on the device, the host or
// both, so the number of nodes is bounded by the number of pages.
struct RadixNode {
  uint64_t hash = 0;  // chained block hash; the key of the tree's index
  NodeId parent = kNoNode;
  int32_t depth = 0;  // pages from the root
  int32_t slot_in_parent = -1;
  std::vector<NodeId> children;
  int32_t device_page = -1;
  int32_t host_page = -1;
  int32_t lock_count = 0;       // running requests whose cached prefix contains this page
  int32_t device_children = 0;  // children holding a device page
  int32_t host_children = 0;    // children holding a host page
  uint64_t hit_count = 0;
  uint64_t last_access = 0;
  bool live = false;
  uint8_t device_lru = 0;  // which device LRU set holds the node (0: none)
  bool in_host_lru = false;
};

// The tree as plain data for inspection tools. Chains of single-child nodes that agree on
// residency and lock count are merged into one entry, so a long prompt is one line.
struct SnapshotNode {
  NodeId id = kNoNode;  // the first page's node id
  NodeId parent_id = kNoNode;
  int32_t depth = 0;       // entries from the root
  int32_t prefix_len = 0;  // tokens before this entry
  std::vector<int32_t> token_ids;
  std::vector<uint64_t> block_hashes;
  std::vector<int32_t> device_pages;
  std::vector<int32_t> host_pages;
  int32_t lock_count = 0;
  uint64_t hit_count = 0;
  uint64_t last_access = 0;
  int32_t num_children = 0;
};

struct CacheSnapshot {
  int32_t page_size = 0;
  int32_t num_nodes = 0;  // pages in the tree (excluding the root)
  int32_t device_pages = 0;
  int32_t host_pages = 0;
  int32_t locked_device_pages = 0;
  bool truncated = false;
  std::vector<SnapshotNode> nodes;
};

// The prefix cache structure. Invariants: the device-resident nodes form a rooted subtree, so do
// the host-resident ones, and a locked node's ancestors are locked. Hence every unlocked page
// can be reclaimed by evicting leaves, and "evictable" is an exact count. Eviction candidates
// are kept in LRU order (by last access tick): device leaves whose page is also on the host,
// device leaves that are not, and host leaves. This class keeps the structure and emits the KV
// events; choosing what to evict and moving pages is the KvCacheManager's job.
class RadixTree {
 public:
  RadixTree(int32_t page_size, int32_t max_pages, KvEventLog* events);

  int32_t page_size() const { return page_size_; }
  const RadixNode& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  // The page's token ids (stored flat, page_size per node, so nodes allocate nothing).
  std::span<const int32_t> tokens(NodeId id) const {
    return std::span<const int32_t>(tokens_).subspan(
        static_cast<size_t>(id) * static_cast<size_t>(page_size_), static_cast<size_t>(page_size_));
  }
  void set_tick(uint64_t tick) { tick_ = tick; }

  // Longest cached path whose pages equal the given pages, root first. By the tiers' prefix
  // closure, its device-resident nodes come first and its host-only nodes after.
  std::vector<NodeId> match(std::span<const uint64_t> page_hashes,
                            std::span<const int32_t> tokens) const;
  void record_hits(std::span<const NodeId> path);

  struct Insertion {
    NodeId node = kNoNode;     // kNoNode: hash collision with a different page; keep it private
    int32_t device_page = -1;  // the page the tree holds for it now
  };
  // Publishes a page just computed into `device_page` as the child of `parent` (which must be
  // device-resident). When that page is already cached on the device, the cached page is
  // returned and the caller frees its duplicate; when cached on the host only, the node takes
  // `device_page`.
  Insertion insert(NodeId parent, uint64_t hash, std::span<const int32_t> tokens,
                   int32_t device_page);

  // Locks are held by running requests on their whole cached path, so a path is pinned on both
  // tiers while it is in use.
  void lock_path(NodeId deepest);
  void unlock_path(NodeId deepest);
  // Extends a held lock by one page: `child`'s parent must already be locked by the holder.
  void lock_child(NodeId child);

  // Tier residency. Attaching requires the parent to be resident on that tier. Detaching
  // requires an unlocked leaf of that tier; a node left with no page is deleted.
  void attach_device_page(NodeId id, int32_t page);
  int32_t detach_device_page(NodeId id);
  void attach_host_page(NodeId id, int32_t page);
  int32_t detach_host_page(NodeId id);

  // Least recently used eviction candidate, or kNoNode.
  NodeId lru_device_leaf(bool with_host_copy) const;
  NodeId lru_host_leaf() const;

  int32_t num_nodes() const { return num_nodes_; }
  int32_t device_pages() const { return device_pages_; }
  int32_t locked_device_pages() const { return locked_device_pages_; }
  int32_t host_pages() const { return host_pages_; }
  int32_t locked_host_pages() const { return locked_host_pages_; }
  bool any_locked() const { return locked_nodes_ > 0; }

  // Every live node except the root, in no particular order.
  std::vector<NodeId> live_nodes() const;
  CacheSnapshot snapshot(int32_t max_nodes) const;
  // Drops every node, appending their pages to the outputs. Requires that nothing is locked.
  void clear(std::vector<int32_t>& device_pages, std::vector<int32_t>& host_pages);
  // Recomputes every invariant and counter from scratch; throws std::logic_error on the first
  // violation. O(nodes); for tests.
  void check_invariants() const;

 private:
  NodeId new_node(NodeId parent, uint64_t hash, std::span<const int32_t> tokens);
  void delete_node(NodeId id);
  void unlink(NodeId id);
  void link(NodeId id);
  void lock_one(NodeId id);
  std::optional<uint64_t> parent_hash(const RadixNode& n) const;
  RadixNode& at(NodeId id) { return nodes_[static_cast<size_t>(id)]; }

  // One residency tier named by member pointers, so attaching and detaching are written once
  // for the device and the host.
  struct Tier {
    int32_t RadixNode::*page;
    int32_t RadixNode::*children;
    int32_t RadixNode::*other_page;
    int32_t RadixTree::*pages;
    int32_t RadixTree::*locked_pages;
    Medium medium;
    const char* name;  // "device" or "host", for error messages
  };
  static const Tier kDeviceTier;
  static const Tier kHostTier;
  void attach_page(const Tier& tier, NodeId id, int32_t page);
  int32_t detach_page(const Tier& tier, NodeId id);

  using LruKey = std::pair<uint64_t, NodeId>;  // (last access tick, id)
  int32_t page_size_;
  KvEventLog* events_;
  uint64_t tick_ = 0;
  std::vector<RadixNode> nodes_;
  std::vector<int32_t> tokens_;  // page_size per node id
  std::vector<NodeId> free_ids_;
  BlockIndex index_;
  std::set<LruKey> device_lru_backed_;
  std::set<LruKey> device_lru_unbacked_;
  std::set<LruKey> host_lru_;
  int32_t num_nodes_ = 0;
  int32_t device_pages_ = 0;
  int32_t locked_device_pages_ = 0;
  int32_t host_pages_ = 0;
  int32_t locked_host_pages_ = 0;
  int32_t locked_nodes_ = 0;
};

}  // namespace tokenspeed
