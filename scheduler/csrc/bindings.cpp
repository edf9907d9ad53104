// Python face of the scheduler: plain data in, plain data out. Index arrays are numpy views of
// scheduler-owned memory (read-only; the view keeps that memory alive).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "tokenspeed/hash.h"
#include "tokenspeed/scheduler.h"

namespace py = pybind11;
using namespace tokenspeed;

namespace {

void make_readonly(py::array& a) {
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
}

template <class T>
py::array view(const std::vector<T>& v, py::handle owner, const py::dtype& dtype) {
  py::array a(dtype, {static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(T))},
              v.data(), owner);
  make_readonly(a);
  return a;
}

py::array int32_view(const std::vector<int32_t>& v, py::handle owner) {
  return view(v, owner, py::dtype::of<int32_t>());
}

// Token ids from a list of ints or a 1-D integer numpy array (any integer dtype that fits).
std::vector<int32_t> to_tokens(py::handle obj, const char* what) {
  if (py::isinstance<py::array>(obj)) {
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (arr.ndim() != 1) throw py::value_error(std::string(what) + " must be a 1-D array");
    const char kind = arr.dtype().kind();
    if (kind != 'i' && kind != 'u') {
      throw py::type_error(std::string(what) + " must have an integer dtype");
    }
    if (arr.dtype().is(py::dtype::of<int32_t>())) {
      auto a = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(arr);
      return {a.data(), a.data() + a.size()};
    }
    auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    std::vector<int32_t> out(static_cast<size_t>(a.size()));
    for (py::ssize_t i = 0; i < a.size(); ++i) {
      const int64_t t = a.data()[i];
      if (t < INT32_MIN || t > INT32_MAX) {
        throw py::value_error(std::string(what) + ": value out of int32 range");
      }
      out[static_cast<size_t>(i)] = static_cast<int32_t>(t);
    }
    return out;
  }
  try {
    return obj.cast<std::vector<int32_t>>();
  } catch (const py::cast_error&) {
    throw py::value_error(std::string(what) + " must be a sequence of int32 token ids");
  }
}

Medium parse_medium(const std::string& s) {
  if (s == "GPU") return Medium::kDevice;
  if (s == "CPU") return Medium::kHost;
  throw py::value_error("medium must be 'GPU' or 'CPU' (got '" + s + "')");
}

py::object optional_hash(const std::optional<uint64_t>& h) {
  return h ? py::object(py::int_(*h)) : py::object(py::none());
}

py::dict snapshot_dict(const CacheSnapshot& snap) {
  py::list nodes;
  for (const SnapshotNode& n : snap.nodes) {
    py::dict d;
    d["id"] = n.id;
    d["parent_id"] =
        n.parent_id == kNoNode ? py::object(py::none()) : py::object(py::int_(n.parent_id));
    d["depth"] = n.depth;
    d["prefix_len"] = n.prefix_len;
    d["num_tokens"] = n.token_ids.size();
    d["token_ids"] = n.token_ids;
    d["block_hashes"] = n.block_hashes;
    d["device_pages"] = n.device_pages;
    d["host_pages"] = n.host_pages;
    d["lock_count"] = n.lock_count;
    d["hit_count"] = n.hit_count;
    d["last_access"] = n.last_access;
    d["num_children"] = n.num_children;
    nodes.append(std::move(d));
  }
  py::dict out;
  out["page_size"] = snap.page_size;
  out["num_nodes"] = snap.num_nodes;
  out["device_pages"] = snap.device_pages;
  out["host_pages"] = snap.host_pages;
  out["locked_device_pages"] = snap.locked_device_pages;
  out["truncated"] = snap.truncated;
  out["nodes"] = std::move(nodes);
  return out;
}

// to_dict() and __repr__ for a struct bound with def_readonly fields.
template <class C>
void add_dict_methods(py::class_<C>& cls, std::vector<const char*> fields) {
  cls.def(
      "to_dict",
      [fields](py::object self) {
        py::dict d;
        for (const char* f : fields) d[f] = self.attr(f);
        return d;
      },
      "The fields as a plain dict.");
  cls.def("__repr__", [fields](py::object self) {
    std::string out = py::str(py::type::handle_of(self).attr("__name__"));
    out += "(";
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += ", ";
      out += std::string(fields[i]) + "=" + std::string(py::repr(self.attr(fields[i])));
    }
    return out + ")";
  });
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "TokenSpeed C++ scheduler (control plane; never touches tensors)";

  py::register_exception<fsm::InvalidTransition>(m, "InvalidTransition", PyExc_RuntimeError);
  py::register_exception<UnknownRequest>(m, "UnknownRequestError", PyExc_KeyError);

  m.def(
      "rolling_hash",
      [](py::handle tokens, int page_size, uint64_t parent) {
        return rolling_hash(to_tokens(tokens, "tokens"), page_size, parent);
      },
      py::arg("tokens"), py::arg("page_size"), py::arg("parent") = 0,
      "Chained 64-bit hashes of the full pages of `tokens` (the block hashes of KV events); "
      "`parent` is the hash of the page before the first one (0 at the root).");

  // --- configuration and requests
  py::class_<SchedulerConfig>(m, "SchedulerConfig",
                              "Scheduler configuration. max_model_len=None means everything the "
                              "device pages can hold; num_host_pages=0 means no host tier.")
      .def(
          py::init([](int32_t page_size, int32_t num_device_pages, int32_t num_host_pages,
                      int32_t max_scheduled_tokens, int32_t max_batch_size,
                      std::optional<int32_t> max_model_len, bool enable_prefix_cache,
                      bool enable_mixed_batch, bool enable_kv_events, int32_t decode_input_tokens) {
            SchedulerConfig c;
            c.page_size = page_size;
            c.num_device_pages = num_device_pages;
            c.num_host_pages = num_host_pages;
            c.max_scheduled_tokens = max_scheduled_tokens;
            c.max_batch_size = max_batch_size;
            c.max_model_len = max_model_len;
            c.enable_prefix_cache = enable_prefix_cache;
            c.enable_mixed_batch = enable_mixed_batch;
            c.enable_kv_events = enable_kv_events;
            c.decode_input_tokens = decode_input_tokens;
            return c;
          }),
          py::arg("page_size"), py::arg("num_device_pages"), py::arg("num_host_pages") = 0,
          py::arg("max_scheduled_tokens") = 8192, py::arg("max_batch_size") = 256,
          py::arg("max_model_len") = py::none(), py::arg("enable_prefix_cache") = true,
          py::arg("enable_mixed_batch") = false, py::arg("enable_kv_events") = false,
          py::arg("decode_input_tokens") = 1)
      .def_readwrite("page_size", &SchedulerConfig::page_size)
      .def_readwrite("num_device_pages", &SchedulerConfig::num_device_pages)
      .def_readwrite("num_host_pages", &SchedulerConfig::num_host_pages)
      .def_readwrite("max_scheduled_tokens", &SchedulerConfig::max_scheduled_tokens)
      .def_readwrite("max_batch_size", &SchedulerConfig::max_batch_size)
      .def_readwrite("max_model_len", &SchedulerConfig::max_model_len)
      .def_readwrite("enable_prefix_cache", &SchedulerConfig::enable_prefix_cache)
      .def_readwrite("enable_mixed_batch", &SchedulerConfig::enable_mixed_batch)
      .def_readwrite("enable_kv_events", &SchedulerConfig::enable_kv_events)
      .def_readwrite("decode_input_tokens", &SchedulerConfig::decode_input_tokens)
      .def("__repr__", [](const SchedulerConfig& c) {
        return "SchedulerConfig(page_size=" + std::to_string(c.page_size) +
               ", num_device_pages=" + std::to_string(c.num_device_pages) +
               ", num_host_pages=" + std::to_string(c.num_host_pages) +
               ", max_scheduled_tokens=" + std::to_string(c.max_scheduled_tokens) +
               ", max_batch_size=" + std::to_string(c.max_batch_size) + ", max_model_len=" +
               (c.max_model_len ? std::to_string(*c.max_model_len) : std::string("None")) +
               ", enable_prefix_cache=" + (c.enable_prefix_cache ? "True" : "False") +
               ", enable_mixed_batch=" + (c.enable_mixed_batch ? "True" : "False") +
               ", enable_kv_events=" + (c.enable_kv_events ? "True" : "False") +
               ", decode_input_tokens=" + std::to_string(c.decode_input_tokens) + ")";
      });

  py::class_<RequestSpec>(m, "RequestSpec",
                          "A request to schedule: its id, prompt token ids (list or 1-D integer "
                          "numpy array), how many tokens it may generate, and a priority (lower "
                          "runs first; ties run in arrival order).")
      .def(py::init([](std::string request_id, py::handle tokens, int32_t max_new_tokens,
                       int32_t priority) {
             return RequestSpec{std::move(request_id), to_tokens(tokens, "tokens"), max_new_tokens,
                                priority};
           }),
           py::arg("request_id"), py::arg("tokens"), py::arg("max_new_tokens"),
           py::arg("priority") = 0)
      .def_readonly("request_id", &RequestSpec::request_id)
      .def_property_readonly("tokens", [](const RequestSpec& s) { return py::cast(s.tokens); })
      .def_readonly("max_new_tokens", &RequestSpec::max_new_tokens)
      .def_readonly("priority", &RequestSpec::priority);

  // --- plans
  py::enum_<ForwardMode>(m, "ForwardMode", "What kind of forward a plan asks for.")
      .value("EXTEND", ForwardMode::kExtend)
      .value("DECODE", ForwardMode::kDecode)
      .value("MIXED", ForwardMode::kMixed)
      .value("IDLE", ForwardMode::kIdle);

  py::class_<ForwardOp, std::shared_ptr<ForwardOp>>(
      m, "ForwardOp",
      "One forward, per-request arrays in forward order (decodes first in MIXED mode). Arrays are "
      "read-only numpy views valid until the next next_execution_plan() call.")
      .def_readonly("forward_id", &ForwardOp::forward_id)
      .def_readonly("mode", &ForwardOp::mode)
      .def_readonly("num_decode", &ForwardOp::num_decode,
                    "The first num_decode requests are decodes, the rest extends.")
      .def_property_readonly("batch_size", &ForwardOp::batch_size)
      .def("__len__", &ForwardOp::batch_size)
      .def_property_readonly(
          "request_ids",
          [](const ForwardOp& op) {
            py::list out(static_cast<size_t>(op.batch_size()));
            for (int32_t i = 0; i < op.batch_size(); ++i) {
              const std::string_view id = op.request_id(i);
              out[static_cast<size_t>(i)] = py::str(id.data(), id.size());
            }
            return out;
          },
          "Request ids as a new list of str (builds Python strings: key hot per-request state "
          "by request_pool_indices instead).")
      .def_property_readonly(
          "request_pool_indices",
          [](py::object self) {
            return int32_view(self.cast<const ForwardOp&>().request_pool_indices, self);
          },
          "Each request's request-pool slot, stable while it runs.")
      .def_property_readonly(
          "prefix_lens",
          [](py::object self) {
            return int32_view(self.cast<const ForwardOp&>().prefix_lens, self);
          },
          "Positions that already hold KV before this step.")
      .def_property_readonly(
          "extend_lens",
          [](py::object self) {
            return int32_view(self.cast<const ForwardOp&>().extend_lens, self);
          },
          "Positions computed in this step (decode_input_tokens for a decode).")
      .def_property_readonly(
          "seq_lens",
          [](py::object self) { return int32_view(self.cast<const ForwardOp&>().seq_lens, self); },
          "KV length after this step: prefix_lens + extend_lens.")
      .def_property_readonly(
          "input_ids",
          [](py::object self) { return int32_view(self.cast<const ForwardOp&>().input_ids, self); },
          "Input token ids, concatenated per request in forward order.")
      .def_property_readonly(
          "sample_mask",
          [](py::object self) {
            return view(self.cast<const ForwardOp&>().sample_mask, self, py::dtype("bool"));
          },
          "Whether a token is sampled for each request (decodes, and last prefill chunks).")
      .def_property_readonly(
          "block_tables",
          [](py::object self) {
            const auto& op = self.cast<const ForwardOp&>();
            const auto rows = static_cast<py::ssize_t>(op.batch_size());
            const auto cols = static_cast<py::ssize_t>(op.block_table_cols);
            const auto stride = static_cast<py::ssize_t>(op.block_table_stride) * 4;
            py::array a(py::dtype::of<int32_t>(), {rows, cols}, {stride, py::ssize_t{4}},
                        op.block_table_data, self);
            make_readonly(a);
            return a;
          },
          "int32 [batch, max pages of the batch]: each request's page ids for positions "
          "0..seq_len-1, padded with -1. A zero-copy view of the scheduler's table when the "
          "batch's rows are contiguous (decode steps), otherwise a gathered copy.")
      .def_readonly("block_table_is_view", &ForwardOp::block_table_is_view)
      .def("__repr__", [](const ForwardOp& op) {
        static const char* names[] = {"EXTEND", "DECODE", "MIXED", "IDLE"};
        return "ForwardOp(forward_id=" + std::to_string(op.forward_id) +
               ", mode=" + names[static_cast<int>(op.mode)] +
               ", batch_size=" + std::to_string(op.batch_size()) +
               ", num_decode=" + std::to_string(op.num_decode) + ")";
      });

  py::class_<WriteBackOp>(m, "WriteBackOp",
                          "Copy device_pages[i] to host_pages[i]; report WriteBackDone(op_id).")
      .def(py::init([](uint64_t op_id, std::vector<int32_t> device_pages,
                       std::vector<int32_t> host_pages) {
             return WriteBackOp{op_id, std::move(device_pages), std::move(host_pages)};
           }),
           py::arg("op_id"), py::arg("device_pages"), py::arg("host_pages"))
      .def_readonly("op_id", &WriteBackOp::op_id)
      .def_property_readonly("device_pages",
                             [](py::object self) {
                               return int32_view(self.cast<const WriteBackOp&>().device_pages,
                                                 self);
                             })
      .def_property_readonly("host_pages",
                             [](py::object self) {
                               return int32_view(self.cast<const WriteBackOp&>().host_pages, self);
                             })
      .def("__repr__", [](const WriteBackOp& op) {
        return "WriteBackOp(op_id=" + std::to_string(op.op_id) +
               ", pages=" + std::to_string(op.device_pages.size()) + ")";
      });

  py::class_<LoadBackOp>(m, "LoadBackOp",
                         "Copy host_pages[i] to device_pages[i]; report LoadBackDone(op_id).")
      .def(py::init([](uint64_t op_id, std::vector<int32_t> host_pages,
                       std::vector<int32_t> device_pages) {
             return LoadBackOp{op_id, std::move(host_pages), std::move(device_pages)};
           }),
           py::arg("op_id"), py::arg("host_pages"), py::arg("device_pages"))
      .def_readonly("op_id", &LoadBackOp::op_id)
      .def_property_readonly("host_pages",
                             [](py::object self) {
                               return int32_view(self.cast<const LoadBackOp&>().host_pages, self);
                             })
      .def_property_readonly("device_pages",
                             [](py::object self) {
                               return int32_view(self.cast<const LoadBackOp&>().device_pages, self);
                             })
      .def("__repr__", [](const LoadBackOp& op) {
        return "LoadBackOp(op_id=" + std::to_string(op.op_id) +
               ", pages=" + std::to_string(op.host_pages.size()) + ")";
      });

  py::class_<ExecutionPlan>(m, "ExecutionPlan",
                            "At most one forward, and the cache ops to run before it in order.")
      .def_property_readonly(
          "forward", [](const ExecutionPlan& p) { return p.forward; },
          "The ForwardOp, or None when there is nothing to run.")
      .def_property_readonly(
          "cache_ops", [](const ExecutionPlan& p) { return p.cache_ops; },
          "WriteBackOp / LoadBackOp list; write-backs come first.")
      .def("__repr__", [](const ExecutionPlan& p) {
        return "ExecutionPlan(forward=" + std::string(p.forward ? "ForwardOp" : "None") +
               ", cache_ops=" + std::to_string(p.cache_ops.size()) + ")";
      });

  // --- execution events
  py::class_<ExtendResult>(m, "ExtendResult",
                           "Tokens one forward produced for one request (1 per decode step; "
                           "several with speculative decoding; none for a prefill chunk that "
                           "did not finish the prompt).")
      .def(py::init([](std::string request_id, py::handle tokens) {
             return ExtendResult{std::move(request_id), to_tokens(tokens, "tokens")};
           }),
           py::arg("request_id"), py::arg("tokens"))
      .def_readonly("request_id", &ExtendResult::request_id)
      .def_property_readonly("tokens", [](const ExtendResult& e) { return py::cast(e.tokens); });

  py::class_<ForwardResult>(m, "ForwardResult",
                            "All tokens of forward `forward_id` at once, for its sampled requests "
                            "in forward order: counts[i] tokens for the i-th (1 each if None).")
      .def(py::init([](uint64_t forward_id, py::handle tokens, py::handle counts) {
             ForwardResult r{forward_id, to_tokens(tokens, "tokens"), {}};
             if (!counts.is_none()) r.counts = to_tokens(counts, "counts");
             return r;
           }),
           py::arg("forward_id"), py::arg("tokens"), py::arg("counts") = py::none())
      .def_readonly("forward_id", &ForwardResult::forward_id)
      .def_property_readonly("tokens", [](const ForwardResult& e) { return py::cast(e.tokens); })
      .def_property_readonly("counts", [](const ForwardResult& e) { return py::cast(e.counts); });

  py::class_<FinishRequest>(m, "Finish",
                            "The engine ended the request (stop token, stop string, max_tokens). "
                            "Harmless if the scheduler already finished it.")
      .def(py::init([](std::string request_id, std::string reason) {
             return FinishRequest{std::move(request_id), std::move(reason)};
           }),
           py::arg("request_id"), py::arg("reason") = "stop")
      .def_readonly("request_id", &FinishRequest::request_id)
      .def_readonly("reason", &FinishRequest::reason);

  py::class_<AbortRequest>(m, "Abort",
                           "Drop the request in whatever state it is; frees everything. "
                           "Ignored for unknown ids.")
      .def(py::init([](std::string request_id) { return AbortRequest{std::move(request_id)}; }),
           py::arg("request_id"))
      .def_readonly("request_id", &AbortRequest::request_id);

  py::class_<WriteBackDone>(m, "WriteBackDone", "The executor finished WriteBackOp op_id.")
      .def(py::init([](uint64_t op_id) { return WriteBackDone{op_id}; }), py::arg("op_id"))
      .def_readonly("op_id", &WriteBackDone::op_id);

  py::class_<LoadBackDone>(m, "LoadBackDone", "The executor finished LoadBackOp op_id.")
      .def(py::init([](uint64_t op_id) { return LoadBackDone{op_id}; }), py::arg("op_id"))
      .def_readonly("op_id", &LoadBackDone::op_id);

  // --- KV events
  py::class_<BlockStored>(m, "BlockStored",
                          "Consecutive pages of one path became resident on `medium`.")
      .def(py::init([](std::vector<uint64_t> block_hashes, std::optional<uint64_t> parent,
                       std::vector<int32_t> token_ids, int32_t block_size,
                       const std::string& medium) {
             return BlockStored{std::move(block_hashes), parent, std::move(token_ids), block_size,
                                parse_medium(medium)};
           }),
           py::arg("block_hashes"), py::arg("parent_block_hash"), py::arg("token_ids"),
           py::arg("block_size"), py::arg("medium") = "GPU")
      .def_readonly("block_hashes", &BlockStored::block_hashes)
      .def_property_readonly(
          "parent_block_hash",
          [](const BlockStored& e) { return optional_hash(e.parent_block_hash); })
      .def_readonly("token_ids", &BlockStored::token_ids)
      .def_readonly("block_size", &BlockStored::block_size)
      .def_property_readonly("lora_id", [](const BlockStored&) { return py::none(); })
      .def_property_readonly("medium", [](const BlockStored& e) { return medium_name(e.medium); })
      .def(
          "to_wire",
          [](const BlockStored& e) {
            return py::make_tuple("BlockStored", e.block_hashes, optional_hash(e.parent_block_hash),
                                  e.token_ids, e.block_size, py::none(), medium_name(e.medium));
          },
          "vLLM's array-like tagged form: [tag, block_hashes, parent_block_hash, token_ids, "
          "block_size, lora_id, medium].")
      .def("__repr__", [](const BlockStored& e) {
        return "BlockStored(blocks=" + std::to_string(e.block_hashes.size()) +
               ", medium=" + medium_name(e.medium) + ")";
      });

  py::class_<BlockRemoved>(m, "BlockRemoved", "Pages stopped being resident on `medium`.")
      .def(py::init([](std::vector<uint64_t> block_hashes, const std::string& medium) {
             return BlockRemoved{std::move(block_hashes), parse_medium(medium)};
           }),
           py::arg("block_hashes"), py::arg("medium") = "GPU")
      .def_readonly("block_hashes", &BlockRemoved::block_hashes)
      .def_property_readonly("medium", [](const BlockRemoved& e) { return medium_name(e.medium); })
      .def(
          "to_wire",
          [](const BlockRemoved& e) {
            return py::make_tuple("BlockRemoved", e.block_hashes, medium_name(e.medium));
          },
          "vLLM's array-like tagged form: [tag, block_hashes, medium].")
      .def("__repr__", [](const BlockRemoved& e) {
        return "BlockRemoved(blocks=" + std::to_string(e.block_hashes.size()) +
               ", medium=" + medium_name(e.medium) + ")";
      });

  py::class_<AllBlocksCleared>(m, "AllBlocksCleared", "Every block of every tier was dropped.")
      .def(py::init<>())
      .def(
          "to_wire", [](const AllBlocksCleared&) { return py::make_tuple("AllBlocksCleared"); },
          "vLLM's array-like tagged form: [tag].")
      .def("__repr__", [](const AllBlocksCleared&) { return "AllBlocksCleared()"; });

  // --- stats
  py::class_<SchedulerStats> stats(m, "SchedulerStats",
                                   "Request counts by state, page counts per tier (total = free "
                                   "+ active + cached) and prefix-cache counters.");
  stats.def_readonly("num_waiting", &SchedulerStats::num_waiting)
      .def_readonly("num_prefilling", &SchedulerStats::num_prefilling)
      .def_readonly("num_decoding", &SchedulerStats::num_decoding)
      .def_readonly("num_retracted", &SchedulerStats::num_retracted)
      .def_readonly("device_pages_total", &SchedulerStats::device_pages_total)
      .def_readonly("device_pages_free", &SchedulerStats::device_pages_free)
      .def_readonly("device_pages_active", &SchedulerStats::device_pages_active)
      .def_readonly("device_pages_cached", &SchedulerStats::device_pages_cached)
      .def_readonly("device_pages_evictable", &SchedulerStats::device_pages_evictable)
      .def_readonly("host_pages_total", &SchedulerStats::host_pages_total)
      .def_readonly("host_pages_free", &SchedulerStats::host_pages_free)
      .def_readonly("host_pages_active", &SchedulerStats::host_pages_active)
      .def_readonly("host_pages_cached", &SchedulerStats::host_pages_cached)
      .def_readonly("host_pages_evictable", &SchedulerStats::host_pages_evictable)
      .def_readonly("prefix_cache_queried_tokens", &SchedulerStats::prefix_cache_queried_tokens)
      .def_readonly("prefix_cache_hit_tokens", &SchedulerStats::prefix_cache_hit_tokens)
      .def_readonly("num_preemptions", &SchedulerStats::num_preemptions)
      .def_readonly("num_cache_ops_in_flight", &SchedulerStats::num_cache_ops_in_flight);
  add_dict_methods(
      stats,
      {"num_waiting", "num_prefilling", "num_decoding", "num_retracted", "device_pages_total",
       "device_pages_free", "device_pages_active", "device_pages_cached", "device_pages_evictable",
       "host_pages_total", "host_pages_free", "host_pages_active", "host_pages_cached",
       "host_pages_evictable", "prefix_cache_queried_tokens", "prefix_cache_hit_tokens",
       "num_preemptions", "num_cache_ops_in_flight"});

  py::class_<RequestStats> rstats(m, "RequestStats", "What the scheduler knows of one request.");
  rstats.def_readonly("request_id", &RequestStats::request_id)
      .def_readonly("state", &RequestStats::state)
      .def_readonly("prompt_tokens", &RequestStats::prompt_tokens)
      .def_readonly("output_tokens", &RequestStats::output_tokens)
      .def_readonly("cached_tokens", &RequestStats::cached_tokens,
                    "Prefix-cache hit at first admission (device + host), in tokens.")
      .def_readonly("host_cached_tokens", &RequestStats::host_cached_tokens)
      .def_readonly("computed_tokens", &RequestStats::computed_tokens)
      .def_readonly("preempt_count", &RequestStats::preempt_count)
      .def_readonly("preempt_ms", &RequestStats::preempt_ms)
      .def_readonly("finished", &RequestStats::finished)
      .def_property_readonly("finish_reason", [](const RequestStats& s) {
        return s.finished ? py::object(py::str(s.finish_reason)) : py::object(py::none());
      });
  add_dict_methods(rstats, {"request_id", "state", "prompt_tokens", "output_tokens",
                            "cached_tokens", "host_cached_tokens", "computed_tokens",
                            "preempt_count", "preempt_ms", "finished", "finish_reason"});

  // --- the scheduler
  py::class_<Scheduler>(m, "Scheduler",
                        "The control plane. Single-threaded: call it from the engine loop only.")
      .def(py::init<const SchedulerConfig&>(), py::arg("config"))
      .def_property_readonly("config", &Scheduler::config,
                             "The configuration with defaults resolved.")
      .def("submit_requests", &Scheduler::submit_requests, py::arg("requests"),
           "Queue requests, all or none; ValueError for a request that can never run or a "
           "duplicate id.")
      .def("next_execution_plan", &Scheduler::next_execution_plan,
           "Plan the next step. Run its cache_ops in order, then its forward, then advance().")
      .def(
          "advance",
          [](Scheduler& s, py::handle events) {
            auto one = [&](py::handle e) {
              if (py::isinstance<ForwardResult>(e))
                return s.advance(e.cast<const ForwardResult&>());
              if (py::isinstance<ExtendResult>(e)) return s.advance(e.cast<const ExtendResult&>());
              if (py::isinstance<FinishRequest>(e))
                return s.advance(e.cast<const FinishRequest&>());
              if (py::isinstance<AbortRequest>(e)) return s.advance(e.cast<const AbortRequest&>());
              if (py::isinstance<WriteBackDone>(e))
                return s.advance(e.cast<const WriteBackDone&>());
              if (py::isinstance<LoadBackDone>(e)) return s.advance(e.cast<const LoadBackDone&>());
              throw py::type_error("advance: not an execution event: " + std::string(py::repr(e)));
            };
            if (py::isinstance<py::list>(events) || py::isinstance<py::tuple>(events)) {
              for (py::handle e : events) one(e);
            } else {
              one(events);
            }
          },
          py::arg("events"), "Apply one execution event or a list of them, in order.")
      .def("drain_kv_events", &Scheduler::drain_kv_events,
           "KV events since the last drain (empty unless enable_kv_events).")
      .def("stats", &Scheduler::stats)
      .def("request_stats", &Scheduler::request_stats, py::arg("request_id"),
           "Per-request stats; known until the plan after the request finished.")
      .def(
          "cache_snapshot",
          [](const Scheduler& s, int32_t max_nodes) {
            return snapshot_dict(s.cache_snapshot(max_nodes));
          },
          py::arg("max_nodes") = 256,
          "The radix tree as plain data, breadth first, single-child chains merged.")
      .def("reset_prefix_cache", &Scheduler::reset_prefix_cache,
           "Drop the whole cache if no running request uses it; returns whether it did.")
      .def("has_unfinished", &Scheduler::has_unfinished)
      .def_property_readonly("num_requests", &Scheduler::num_unfinished,
                             "Unfinished requests (waiting, running or retracted).")
      .def(
          "page_owners",
          [](const Scheduler& s) {
            const PageOwners o = s.page_owners();
            py::dict d;
            d["device_free"] = o.device_free;
            d["host_free"] = o.host_free;
            d["tree_device"] = o.tree_device;
            d["tree_host"] = o.tree_host;
            py::dict priv, rows;
            for (const auto& [id, pages] : o.request_private) priv[py::str(id)] = pages;
            for (const auto& [id, pages] : o.request_rows) rows[py::str(id)] = pages;
            d["request_private"] = priv;
            d["request_rows"] = rows;
            return d;
          },
          "Which owner holds each page (for tests and debugging).")
      .def("check_invariants", &Scheduler::check_invariants,
           "Verify ownership, block tables and the tree from scratch; RuntimeError if broken.");
}
