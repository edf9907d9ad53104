#pragma once
// What the scheduler hands to the executor each step.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tokenspeed {

// Values match the runtime's enum.
enum class ForwardMode : uint8_t { kExtend = 0, kDecode = 1, kMixed = 2, kIdle = 3 };

// One forward: per-request arrays in forward order (in MIXED mode, decode requests first).
// For request i: prefix_lens[i] positions already hold KV, extend_lens[i] positions are computed
// now, seq_lens[i] = prefix_lens[i] + extend_lens[i]. input_ids concatenates each request's
// inputs: its next prompt chunk for an extend, its last token for a decode (with speculative
// verify, decode_input_tokens > 1, positions are reserved but the runtime appends the drafts).
// sample_mask[i] says whether a token is sampled for request i: always for a decode, for an
// extend only on the request's last prefill chunk.
struct ForwardOp {
  uint64_t forward_id = 0;
  ForwardMode mode = ForwardMode::kIdle;
  int32_t num_decode = 0;  // the first num_decode requests are decodes
  std::string id_chars;    // request ids concatenated; split by id_offsets
  std::vector<int32_t> id_offsets;
  std::vector<int32_t> request_pool_indices;
  std::vector<int32_t> prefix_lens;
  std::vector<int32_t> extend_lens;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> sample_mask;

  // Block tables [batch, block_table_cols], row stride block_table_stride: a view of the
  // scheduler's table (kept alive by block_table_owner) or a gathered copy it owns.
  std::shared_ptr<const void> block_table_owner;
  const int32_t* block_table_data = nullptr;
  int32_t block_table_cols = 0;
  int32_t block_table_stride = 0;
  bool block_table_is_view = false;

  int32_t batch_size() const { return static_cast<int32_t>(request_pool_indices.size()); }
  std::string_view request_id(int32_t i) const {
    return std::string_view(id_chars).substr(
        static_cast<size_t>(id_offsets[static_cast<size_t>(i)]),
        static_cast<size_t>(id_offsets[static_cast<size_t>(i) + 1] -
                            id_offsets[static_cast<size_t>(i)]));
  }
};

// Copy device pages to host pages (a write-back), pairwise.
struct WriteBackOp {
  uint64_t op_id = 0;
  std::vector<int32_t> device_pages;
  std::vector<int32_t> host_pages;
};

// Copy host pages to device pages (a load-back), pairwise.
struct LoadBackOp {
  uint64_t op_id = 0;
  std::vector<int32_t> host_pages;
  std::vector<int32_t> device_pages;
};

using CacheOp = std::variant<WriteBackOp, LoadBackOp>;

// At most one forward and the cache ops to run before it, in list order (write-backs before
// load-backs): the plan may reuse a device page whose content a write-back of the same plan
// saves, and a forward may read pages a load-back of the same plan fills.
struct ExecutionPlan {
  std::shared_ptr<ForwardOp> forward;  // null when there is nothing to run
  std::vector<CacheOp> cache_ops;
};

// --- what the executor reports back ---------------------------------------------------------

// Tokens the forward produced for one request: one per decode step, several with speculative
// decoding; for a prefill chunk that did not finish the prompt nothing is expected (an empty
// list is accepted).
struct ExtendResult {
  std::string request_id;
  std::vector<int32_t> tokens;
};

// The tokens of a whole forward at once, for the sampled requests of `forward_id` in forward
// order: counts[i] tokens for the i-th sampled request (one each when counts is empty).
struct ForwardResult {
  uint64_t forward_id = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;
};

struct FinishRequest {
  std::string request_id;
  std::string reason;
};
struct AbortRequest {
  std::string request_id;
};
struct WriteBackDone {
  uint64_t op_id = 0;
};
struct LoadBackDone {
  uint64_t op_id = 0;
};

using ExecutionEvent = std::variant<ExtendResult, ForwardResult, FinishRequest, AbortRequest,
                                    WriteBackDone, LoadBackDone>;

}  // namespace tokenspeed
