#include "tokenspeed/hash.h"

#include <stdexcept>

namespace tokenspeed {
namespace {

constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMulA = 0x87c37b91114253d5ULL;
constexpr uint64_t kMulB = 0x4cf5ad432745937fULL;

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Murmur3's 64-bit finaliser: every input bit affects every output bit.
constexpr uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

uint64_t hash_page(uint64_t parent, std::span<const int32_t> page) {
  uint64_t h = fmix64(parent ^ kSeed);
  size_t i = 0;
  // Two tokens per 64-bit lane, Murmur-style body.
  for (; i + 1 < page.size(); i += 2) {
    const uint64_t lane = static_cast<uint32_t>(page[i]) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(page[i + 1])) << 32);
    h ^= rotl(lane * kMulA, 31) * kMulB;
    h = rotl(h, 27) * 5 + 0x52dce729;
  }
  if (i < page.size()) {
    h ^= rotl(static_cast<uint32_t>(page[i]) * kMulA, 31) * kMulB;
  }
  return fmix64(h ^ page.size());
}

std::vector<uint64_t> rolling_hash(std::span<const int32_t> tokens, int page_size,
                                   uint64_t parent) {
  if (page_size <= 0) throw std::invalid_argument("rolling_hash: page_size must be positive");
  const size_t ps = static_cast<size_t>(page_size);
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / ps);
  for (size_t start = 0; start + ps <= tokens.size(); start += ps) {
    parent = hash_page(parent, tokens.subspan(start, ps));
    out.push_back(parent);
  }
  return out;
}

}  // namespace tokenspeed
