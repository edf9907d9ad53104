#pragma once
// Chained per-page block hashes: the keys of the prefix cache and of the KV events.

#include <cstdint>
#include <span>
#include <vector>

namespace tokenspeed {

// Hash of one full page chained on its parent page's hash (0 for the first page). Equal hashes
// mean equal token prefixes up to 64-bit collisions, which the radix tree guards against by
// comparing tokens; KV-event consumers key on these values. Deterministic across processes.
uint64_t hash_page(uint64_t parent, std::span<const int32_t> page);

// Chained hashes of every full page of `tokens`; a trailing partial page is not hashed, because
// only full pages are ever shared.
std::vector<uint64_t> rolling_hash(std::span<const int32_t> tokens, int page_size,
                                   uint64_t parent = 0);

}  // namespace tokenspeed
