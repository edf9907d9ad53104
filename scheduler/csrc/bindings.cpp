#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "tokenspeed/hash.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "TokenSpeed C++ scheduler (control plane; never touches tensors)";
  m.def(
      "rolling_hash",
      [](const std::vector<int32_t>& tokens, int page_size, uint64_t parent) {
        return tokenspeed::rolling_hash(tokens, page_size, parent);
      },
      py::arg("tokens"), py::arg("page_size"), py::arg("parent") = 0,
      "Chained per-page hashes of the full pages of `tokens`.");
}
