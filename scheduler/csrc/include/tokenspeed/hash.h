#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tokenspeed {

// Chained per-page hash: a page's hash covers its tokens and its parent's hash, so equal
// hashes mean equal prefixes (up to 64-bit collisions), which is what KV-event consumers key on.
std::vector<uint64_t> rolling_hash(std::span<const int32_t> tokens, int page_size,
                                   uint64_t parent = 0);

}  // namespace tokenspeed
