#include "tokenspeed/request.h"

#include "tokenspeed/hash.h"

namespace tokenspeed {

void Request::hash_pages(int32_t num_pages, int32_t page_size) {
  while (static_cast<int32_t>(page_hashes.size()) < num_pages) {
    const int32_t page = static_cast<int32_t>(page_hashes.size());
    const uint64_t parent = page == 0 ? 0 : page_hashes.back();
    page_hashes.push_back(hash_page(parent, page_tokens(page, page_size)));
  }
}

}  // namespace tokenspeed
