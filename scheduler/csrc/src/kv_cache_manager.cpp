#include "tokenspeed/kv_cache_manager.h"

#include <algorithm>
#include <stdexcept>

namespace tokenspeed {

KvCacheManager::KvCacheManager(int32_t page_size, int32_t device_pages, int32_t host_pages,
                               bool prefix_cache, KvEventLog* events)
    : page_size_(page_size),
      prefix_cache_(prefix_cache),
      device_(device_pages, "device pages"),
      host_(host_pages, "host pages"),
      tree_(page_size, device_pages + host_pages, events) {}

bool KvCacheManager::allocate_device(int32_t n, std::vector<int32_t>& out) {
  if (n <= 0) return true;
  if (n > available_device_pages()) return false;
  if (device_.num_free() < n) evict_device(n - device_.num_free());
  return device_.allocate(n, out);
}

int32_t KvCacheManager::host_page_for(NodeId id) {
  int32_t page = host_.allocate_one();
  if (page < 0 && evict_host(1) == 1) page = host_.allocate_one();
  if (page < 0) return -1;
  // Evicting may have dropped the parent's host copy; the child cannot be backed up without it.
  const NodeId parent = tree_.node(id).parent;
  if (parent != kRootNode && tree_.node(parent).host_page < 0) {
    host_.free(page);
    return -1;
  }
  return page;
}

int32_t KvCacheManager::evict_device(int32_t n) {
  int32_t freed = 0;
  while (freed < n) {
    NodeId victim = tree_.lru_device_leaf(/*with_host_copy=*/true);
    if (victim == kNoNode) {
      victim = tree_.lru_device_leaf(/*with_host_copy=*/false);
      if (victim == kNoNode) break;
      const RadixNode& v = tree_.node(victim);
      const bool parent_on_host = v.parent == kRootNode || tree_.node(v.parent).host_page >= 0;
      if (has_host_tier() && parent_on_host) {
        const int32_t host_page = host_page_for(victim);
        if (host_page >= 0) {
          write_backs_.push_back({tree_.node(victim).device_page, host_page});
          tree_.attach_host_page(victim, host_page);
        }
      }
    }
    device_.free(tree_.detach_device_page(victim));
    ++freed;
  }
  return freed;
}

int32_t KvCacheManager::evict_host(int32_t n) {
  int32_t freed = 0;
  while (freed < n) {
    const NodeId victim = tree_.lru_host_leaf();
    if (victim == kNoNode) break;
    host_.free(tree_.detach_host_page(victim));
    ++freed;
  }
  return freed;
}

bool KvCacheManager::back_up_path(NodeId deepest) {
  if (!has_host_tier()) return false;
  std::vector<NodeId> path;
  for (NodeId id = deepest; id != kRootNode; id = tree_.node(id).parent) path.push_back(id);
  std::reverse(path.begin(), path.end());
  bool queued = false;
  for (NodeId id : path) {
    const RadixNode& n = tree_.node(id);
    if (n.host_page >= 0) continue;
    const int32_t host_page = host_page_for(id);
    if (host_page < 0) break;
    write_backs_.push_back({n.device_page, host_page});
    tree_.attach_host_page(id, host_page);
    queued = true;
  }
  return queued;
}

void KvCacheManager::load_back(std::span<const NodeId> nodes, std::span<const int32_t> targets) {
  if (nodes.size() != targets.size()) throw std::logic_error("load_back: size mismatch");
  for (size_t i = 0; i < nodes.size(); ++i) {
    load_backs_.push_back({tree_.node(nodes[i]).host_page, targets[i]});
    tree_.attach_device_page(nodes[i], targets[i]);
  }
}

std::vector<PageCopy> KvCacheManager::take_write_backs() {
  std::vector<PageCopy> out;
  out.swap(write_backs_);
  return out;
}

std::vector<PageCopy> KvCacheManager::take_load_backs() {
  std::vector<PageCopy> out;
  out.swap(load_backs_);
  return out;
}

bool KvCacheManager::reset() {
  if (tree_.any_locked()) return false;
  std::vector<int32_t> device_pages, host_pages;
  tree_.clear(device_pages, host_pages);
  device_.free(device_pages);
  host_.free(host_pages);
  return true;
}

}  // namespace tokenspeed
