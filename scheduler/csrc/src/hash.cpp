#include "tokenspeed/hash.h"

#include <stdexcept>

namespace tokenspeed {
namespace {
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffU;
    h *= kFnvPrime;
  }
  return h;
}
}  // namespace

std::vector<uint64_t> rolling_hash(std::span<const int32_t> tokens, int page_size, uint64_t parent) {
  if (page_size <= 0) throw std::invalid_argument("rolling_hash: page_size must be positive");
  std::vector<uint64_t> out;
  const size_t full = tokens.size() / static_cast<size_t>(page_size);
  out.reserve(full);
  for (size_t p = 0; p < full; ++p) {
    uint64_t h = mix(kFnvOffset, parent);
    for (int i = 0; i < page_size; ++i) h = mix(h, static_cast<uint32_t>(tokens[p * page_size + i]));
    out.push_back(h);
    parent = h;
  }
  return out;
}

}  // namespace tokenspeed
