#include "tokenspeed/config.h"

#include <stdexcept>
#include <string>

namespace tokenspeed {
namespace {

void require_at_least(const char* field, int64_t value, int64_t minimum) {
  if (value < minimum) {
    throw std::invalid_argument(std::string("SchedulerConfig.") + field + " must be >= " +
                                std::to_string(minimum) + " (got " + std::to_string(value) + ")");
  }
}

}  // namespace

int32_t SchedulerConfig::max_model_len_or_default() const {
  if (max_model_len) return *max_model_len;
  const int64_t all = static_cast<int64_t>(page_size) * num_device_pages;
  return static_cast<int32_t>(std::min<int64_t>(all, INT32_MAX / 2));
}

SchedulerConfig SchedulerConfig::resolved() const {
  require_at_least("page_size", page_size, 1);
  require_at_least("num_device_pages", num_device_pages, 1);
  require_at_least("num_host_pages", num_host_pages, 0);
  require_at_least("max_scheduled_tokens", max_scheduled_tokens, 1);
  require_at_least("max_batch_size", max_batch_size, 1);
  require_at_least("decode_input_tokens", decode_input_tokens, 1);
  if (max_model_len) require_at_least("max_model_len", *max_model_len, 1);
  if (num_host_pages > 0 && !enable_prefix_cache) {
    throw std::invalid_argument(
        "SchedulerConfig: a host tier (num_host_pages > 0) needs enable_prefix_cache=True, "
        "since host pages are kept by the prefix cache");
  }
  SchedulerConfig out = *this;
  out.max_model_len = max_model_len_or_default();
  return out;
}

}  // namespace tokenspeed
