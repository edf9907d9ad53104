#include "tokenspeed/forward_resources.h"

#include <span>
#include <utility>

namespace tokenspeed {

ForwardResources::ForwardResources(const ResourceOwners* owners, int32_t slot, NodeId locked_path)
    : path_node(locked_path), owners_(owners), slot_(slot) {}

ForwardResources::ForwardResources(ForwardResources&& other) noexcept
    : path_node(other.path_node),
      pages(std::move(other.pages)),
      num_tree_pages(other.num_tree_pages),
      kv_len(other.kv_len),
      publishing_stopped(other.publishing_stopped),
      owners_(std::exchange(other.owners_, nullptr)),
      slot_(std::exchange(other.slot_, -1)) {}

ForwardResources& ForwardResources::operator=(ForwardResources&& other) noexcept {
  if (this != &other) {
    release();
    path_node = other.path_node;
    pages = std::move(other.pages);
    num_tree_pages = other.num_tree_pages;
    kv_len = other.kv_len;
    publishing_stopped = other.publishing_stopped;
    owners_ = std::exchange(other.owners_, nullptr);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

void ForwardResources::push_page(int32_t page) {
  pages.push_back(page);
  owners_->table->push_page(slot_, page);
}

void ForwardResources::replace_page(int32_t index, int32_t page) {
  pages[static_cast<size_t>(index)] = page;
  owners_->table->set_page(slot_, index, page);
}

void ForwardResources::release() noexcept {
  if (owners_ == nullptr) return;
  const auto private_pages =
      std::span<const int32_t>(pages).subspan(static_cast<size_t>(num_tree_pages));
  owners_->kv->free_device(private_pages);
  owners_->kv->tree().unlock_path(path_node);
  owners_->table->remove(slot_);
  owners_->req_pool->free(slot_);
  owners_ = nullptr;
  slot_ = -1;
  pages.clear();
}

}  // namespace tokenspeed
