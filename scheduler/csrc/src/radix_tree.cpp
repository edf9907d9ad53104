#include "tokenspeed/radix_tree.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

namespace tokenspeed {
namespace {

constexpr uint8_t kLruNone = 0;
constexpr uint8_t kLruBacked = 1;
constexpr uint8_t kLruUnbacked = 2;

// Builds the message only on failure: attach/detach run once per page on the hot path.
[[noreturn]] void tier_error(const char* what, const char* tier) {
  throw std::logic_error(std::string("radix tree: ") + what + tier);
}

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("radix tree: ") + what);
}

}  // namespace

RadixTree::RadixTree(int32_t page_size, int32_t max_pages, KvEventLog* events)
    : page_size_(page_size), events_(events), index_(max_pages) {
  nodes_.reserve(static_cast<size_t>(max_pages) + 1);
  tokens_.resize(static_cast<size_t>(page_size));
  RadixNode root;
  root.live = true;
  nodes_.push_back(std::move(root));
}

std::optional<uint64_t> RadixTree::parent_hash(const RadixNode& n) const {
  if (n.parent == kRootNode) return std::nullopt;
  return node(n.parent).hash;
}

// --- LRU candidate sets ---------------------------------------------------------------------

void RadixTree::unlink(NodeId id) {
  RadixNode& n = at(id);
  if (n.device_lru == kLruBacked) device_lru_backed_.erase({n.last_access, id});
  if (n.device_lru == kLruUnbacked) device_lru_unbacked_.erase({n.last_access, id});
  if (n.in_host_lru) host_lru_.erase({n.last_access, id});
  n.device_lru = kLruNone;
  n.in_host_lru = false;
}

void RadixTree::link(NodeId id) {
  if (id == kRootNode) return;
  RadixNode& n = at(id);
  if (n.lock_count != 0) return;
  if (n.device_page >= 0 && n.device_children == 0) {
    if (n.host_page >= 0) {
      device_lru_backed_.insert({n.last_access, id});
      n.device_lru = kLruBacked;
    } else {
      device_lru_unbacked_.insert({n.last_access, id});
      n.device_lru = kLruUnbacked;
    }
  }
  if (n.host_page >= 0 && n.host_children == 0) {
    host_lru_.insert({n.last_access, id});
    n.in_host_lru = true;
  }
}

NodeId RadixTree::lru_device_leaf(bool with_host_copy) const {
  const auto& set = with_host_copy ? device_lru_backed_ : device_lru_unbacked_;
  return set.empty() ? kNoNode : set.begin()->second;
}

NodeId RadixTree::lru_host_leaf() const {
  return host_lru_.empty() ? kNoNode : host_lru_.begin()->second;
}

// --- structure ------------------------------------------------------------------------------

NodeId RadixTree::new_node(NodeId parent, uint64_t hash, std::span<const int32_t> tokens) {
  NodeId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
    tokens_.resize(tokens_.size() + static_cast<size_t>(page_size_));
  }
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(id) * page_size_);
  RadixNode& p = at(parent);
  RadixNode& n = at(id);
  n.live = true;
  n.hash = hash;
  n.parent = parent;
  n.depth = p.depth + 1;
  n.last_access = tick_;
  n.slot_in_parent = static_cast<int32_t>(p.children.size());
  p.children.push_back(id);
  index_.insert(hash, id);
  ++num_nodes_;
  return id;
}

void RadixTree::delete_node(NodeId id) {
  RadixNode& n = at(id);
  require(n.children.empty() && n.device_page < 0 && n.host_page < 0 && n.lock_count == 0,
          "deleting a node that still holds children, pages or locks");
  unlink(id);
  RadixNode& p = at(n.parent);
  const NodeId moved = p.children.back();
  p.children[static_cast<size_t>(n.slot_in_parent)] = moved;
  at(moved).slot_in_parent = n.slot_in_parent;
  p.children.pop_back();
  index_.erase(n.hash);
  std::vector<NodeId> keep = std::move(n.children);  // reuse its capacity for the next node
  n = RadixNode{};
  n.children = std::move(keep);
  free_ids_.push_back(id);
  --num_nodes_;
}

std::vector<NodeId> RadixTree::match(std::span<const uint64_t> page_hashes,
                                     std::span<const int32_t> tokens) const {
  std::vector<NodeId> path;
  NodeId current = kRootNode;
  const size_t ps = static_cast<size_t>(page_size_);
  for (size_t i = 0; i < page_hashes.size(); ++i) {
    const NodeId id = index_.find(page_hashes[i]);
    if (id < 0) break;
    const auto page = tokens.subspan(i * ps, ps);
    const auto cached = this->tokens(id);
    if (node(id).parent != current || !std::equal(page.begin(), page.end(), cached.begin())) {
      break;
    }
    path.push_back(id);
    current = id;
  }
  return path;
}

void RadixTree::record_hits(std::span<const NodeId> path) {
  for (NodeId id : path) ++at(id).hit_count;
}

RadixTree::Insertion RadixTree::insert(NodeId parent, uint64_t hash,
                                       std::span<const int32_t> tokens, int32_t device_page) {
  if (const NodeId id = index_.find(hash); id >= 0) {
    const RadixNode& n = node(id);
    const auto cached = this->tokens(id);
    if (n.parent != parent || !std::equal(tokens.begin(), tokens.end(), cached.begin())) {
      return {};
    }
    if (n.device_page >= 0) return {id, n.device_page};
    attach_device_page(id, device_page);
    return {id, device_page};
  }
  const NodeId id = new_node(parent, hash, tokens);
  attach_device_page(id, device_page);
  return {id, device_page};
}

// --- locks ----------------------------------------------------------------------------------

void RadixTree::lock_one(NodeId id) {
  RadixNode& n = at(id);
  if (n.lock_count++ == 0) {
    unlink(id);
    ++locked_nodes_;
    if (n.device_page >= 0) ++locked_device_pages_;
    if (n.host_page >= 0) ++locked_host_pages_;
  }
  n.last_access = tick_;
}

void RadixTree::lock_path(NodeId deepest) {
  for (NodeId id = deepest; id != kRootNode; id = node(id).parent) lock_one(id);
}

void RadixTree::lock_child(NodeId child) {
  require(node(child).parent == kRootNode || node(node(child).parent).lock_count > 0,
          "lock_child: the parent is not locked");
  lock_one(child);
}

void RadixTree::unlock_path(NodeId deepest) {
  for (NodeId id = deepest; id != kRootNode; id = node(id).parent) {
    RadixNode& n = at(id);
    require(n.lock_count > 0, "unlocking a node that is not locked");
    n.last_access = tick_;  // locked nodes are in no LRU set, so the key may change freely
    if (--n.lock_count == 0) {
      --locked_nodes_;
      if (n.device_page >= 0) --locked_device_pages_;
      if (n.host_page >= 0) --locked_host_pages_;
      link(id);
    }
  }
}

// --- residency ------------------------------------------------------------------------------

const RadixTree::Tier RadixTree::kDeviceTier{&RadixNode::device_page,
                                             &RadixNode::device_children,
                                             &RadixNode::host_page,
                                             &RadixTree::device_pages_,
                                             &RadixTree::locked_device_pages_,
                                             Medium::kDevice,
                                             "device"};
const RadixTree::Tier RadixTree::kHostTier{&RadixNode::host_page,
                                           &RadixNode::host_children,
                                           &RadixNode::device_page,
                                           &RadixTree::host_pages_,
                                           &RadixTree::locked_host_pages_,
                                           Medium::kHost,
                                           "host"};

void RadixTree::attach_page(const Tier& tier, NodeId id, int32_t page) {
  RadixNode& n = at(id);
  if (n.*tier.page >= 0) tier_error("attach: node already on the ", tier.name);
  if (n.parent != kRootNode && node(n.parent).*tier.page < 0) {
    tier_error("attach: parent is not on the ", tier.name);
  }
  unlink(id);
  n.*tier.page = page;
  ++(this->*tier.pages);
  if (n.lock_count > 0) ++(this->*tier.locked_pages);
  link(id);
  unlink(n.parent);
  ++(at(n.parent).*tier.children);
  link(n.parent);
  events_->stored(n.hash, parent_hash(n), tokens(id), tier.medium);
}

int32_t RadixTree::detach_page(const Tier& tier, NodeId id) {
  RadixNode& n = at(id);
  if (n.*tier.page < 0 || n.lock_count != 0 || n.*tier.children != 0) {
    tier_error("detach: not an unlocked leaf on the ", tier.name);
  }
  unlink(id);
  const int32_t page = n.*tier.page;
  n.*tier.page = -1;
  --(this->*tier.pages);
  const NodeId parent = n.parent;
  unlink(parent);
  --(at(parent).*tier.children);
  link(parent);
  events_->removed(n.hash, tier.medium);
  if (n.*tier.other_page < 0) {
    delete_node(id);
  } else {
    link(id);
  }
  return page;
}

void RadixTree::attach_device_page(NodeId id, int32_t page) { attach_page(kDeviceTier, id, page); }
int32_t RadixTree::detach_device_page(NodeId id) { return detach_page(kDeviceTier, id); }
void RadixTree::attach_host_page(NodeId id, int32_t page) { attach_page(kHostTier, id, page); }
int32_t RadixTree::detach_host_page(NodeId id) { return detach_page(kHostTier, id); }

// --- whole-tree views -----------------------------------------------------------------------

std::vector<NodeId> RadixTree::live_nodes() const {
  std::vector<NodeId> out;
  out.reserve(static_cast<size_t>(num_nodes_));
  for (size_t id = 1; id < nodes_.size(); ++id) {
    if (nodes_[id].live) out.push_back(static_cast<NodeId>(id));
  }
  return out;
}

CacheSnapshot RadixTree::snapshot(int32_t max_nodes) const {
  CacheSnapshot snap;
  snap.page_size = page_size_;
  snap.num_nodes = num_nodes_;
  snap.device_pages = device_pages_;
  snap.host_pages = host_pages_;
  snap.locked_device_pages = locked_device_pages_;
  if (max_nodes <= 0) {
    snap.truncated = num_nodes_ > 0;
    return snap;
  }
  SnapshotNode root;
  root.id = kRootNode;
  root.num_children = static_cast<int32_t>(node(kRootNode).children.size());
  snap.nodes.push_back(std::move(root));

  struct Pending {
    NodeId head;
    NodeId parent_entry;
    int32_t depth;
    int32_t prefix_len;
  };
  std::deque<Pending> queue;
  for (NodeId c : node(kRootNode).children) queue.push_back({c, kRootNode, 1, 0});
  while (!queue.empty()) {
    if (static_cast<int32_t>(snap.nodes.size()) >= max_nodes) {
      snap.truncated = true;
      break;
    }
    const Pending item = queue.front();
    queue.pop_front();
    SnapshotNode entry;
    entry.id = item.head;
    entry.parent_id = item.parent_entry;
    entry.depth = item.depth;
    entry.prefix_len = item.prefix_len;
    const RadixNode& head = node(item.head);
    entry.lock_count = head.lock_count;
    entry.hit_count = head.hit_count;
    NodeId cur = item.head;
    for (;;) {
      const RadixNode& n = node(cur);
      const auto page = tokens(cur);
      entry.token_ids.insert(entry.token_ids.end(), page.begin(), page.end());
      entry.block_hashes.push_back(n.hash);
      if (n.device_page >= 0) entry.device_pages.push_back(n.device_page);
      if (n.host_page >= 0) entry.host_pages.push_back(n.host_page);
      entry.last_access = std::max(entry.last_access, n.last_access);
      if (n.children.size() != 1) break;
      const RadixNode& c = node(n.children[0]);
      const bool same = (c.device_page >= 0) == (head.device_page >= 0) &&
                        (c.host_page >= 0) == (head.host_page >= 0) &&
                        c.lock_count == head.lock_count;
      if (!same) break;
      cur = n.children[0];
    }
    const RadixNode& tail = node(cur);
    entry.num_children = static_cast<int32_t>(tail.children.size());
    const int32_t end = item.prefix_len + static_cast<int32_t>(entry.token_ids.size());
    for (NodeId c : tail.children) queue.push_back({c, item.head, item.depth + 1, end});
    snap.nodes.push_back(std::move(entry));
  }
  return snap;
}

void RadixTree::clear(std::vector<int32_t>& device_pages, std::vector<int32_t>& host_pages) {
  require(locked_nodes_ == 0, "clear: nodes are locked");
  for (NodeId id : live_nodes()) {
    const RadixNode& n = node(id);
    if (n.device_page >= 0) device_pages.push_back(n.device_page);
    if (n.host_page >= 0) host_pages.push_back(n.host_page);
  }
  RadixNode root;
  root.live = true;
  nodes_.clear();
  nodes_.push_back(std::move(root));
  tokens_.resize(static_cast<size_t>(page_size_));
  free_ids_.clear();
  index_.clear();
  device_lru_backed_.clear();
  device_lru_unbacked_.clear();
  host_lru_.clear();
  num_nodes_ = device_pages_ = locked_device_pages_ = host_pages_ = locked_host_pages_ = 0;
  events_->cleared();
}

void RadixTree::check_invariants() const {
  int32_t nodes = 0, dev = 0, locked_dev = 0, host = 0, locked_host = 0, locked = 0;
  size_t backed = 0, unbacked = 0, host_leaves = 0;
  for (NodeId id : live_nodes()) {
    const RadixNode& n = node(id);
    const RadixNode& p = node(n.parent);
    ++nodes;
    require(p.live, "a node's parent is dead");
    require(p.children[static_cast<size_t>(n.slot_in_parent)] == id, "parent link mismatch");
    require(n.depth == p.depth + 1, "depth mismatch");
    require(n.device_page >= 0 || n.host_page >= 0, "a node holds no page");
    require(n.device_page < 0 || n.parent == kRootNode || p.device_page >= 0,
            "device residency is not prefix-closed");
    require(n.host_page < 0 || n.parent == kRootNode || p.host_page >= 0,
            "host residency is not prefix-closed");
    require(n.lock_count == 0 || n.parent == kRootNode || p.lock_count > 0,
            "a locked node has an unlocked parent");
    require(index_.find(n.hash) == id, "index mismatch");
    int32_t dc = 0, hc = 0;
    for (NodeId c : n.children) {
      dc += node(c).device_page >= 0;
      hc += node(c).host_page >= 0;
    }
    require(dc == n.device_children && hc == n.host_children, "child counters mismatch");
    dev += n.device_page >= 0;
    host += n.host_page >= 0;
    locked += n.lock_count > 0;
    locked_dev += n.lock_count > 0 && n.device_page >= 0;
    locked_host += n.lock_count > 0 && n.host_page >= 0;
    const bool dev_leaf = n.device_page >= 0 && n.lock_count == 0 && n.device_children == 0;
    const bool host_leaf = n.host_page >= 0 && n.lock_count == 0 && n.host_children == 0;
    require(dev_leaf == (n.device_lru != kLruNone), "device LRU membership mismatch");
    require(host_leaf == n.in_host_lru, "host LRU membership mismatch");
    if (dev_leaf) (n.host_page >= 0 ? backed : unbacked)++;
    host_leaves += host_leaf;
  }
  require(nodes == num_nodes_ && dev == device_pages_ && host == host_pages_ &&
              locked_dev == locked_device_pages_ && locked_host == locked_host_pages_ &&
              locked == locked_nodes_,
          "counters mismatch");
  require(backed == device_lru_backed_.size() && unbacked == device_lru_unbacked_.size() &&
              host_leaves == host_lru_.size(),
          "LRU set sizes mismatch");
  require(index_.size() == num_nodes_, "index size mismatch");
}

}  // namespace tokenspeed
