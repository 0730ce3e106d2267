// Dataset index helpers for megatron/data (pybind11): the GPT sample index and the blending
// index. Both are linear passes that are too slow as Python loops for billions of tokens.
// megatron/data/index_helpers.py holds the numpy twins, which must give identical results.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace py = pybind11;

namespace {

// Sample i of seq_length + 1 tokens starts at token position i * seq_length of the stream
// formed by the documents in doc_idx order (consecutive samples share one token). Row i of
// the result is (index into doc_idx, token offset inside that document) of that position;
// rows i and i + 1 delimit sample i. Walks the documents once: O(len(doc_idx) + samples).
template <typename T>
py::array build_sample_idx_impl(const py::array_t<int32_t>& sizes_,
                                const py::array_t<int32_t>& doc_idx_,
                                int64_t seq_length, int64_t num_samples) {
  auto sizes = sizes_.unchecked<1>();
  auto doc_idx = doc_idx_.unchecked<1>();
  const int64_t n_doc_idx = doc_idx.shape(0);
  T* out = new T[2 * (num_samples + 1)];
  {
    py::gil_scoped_release release;
    int64_t doc_i = 0;       // index into doc_idx
    int64_t doc_offset = 0;  // token offset inside doc_idx[doc_i]
    out[0] = 0;
    out[1] = 0;
    for (int64_t s = 1; s <= num_samples; ++s) {
      int64_t remaining = seq_length + 1;
      while (remaining != 0) {
        if (doc_i >= n_doc_idx) {
          delete[] out;
          throw std::runtime_error("build_sample_idx: documents hold fewer tokens than needed");
        }
        const int64_t doc_length = sizes[doc_idx[doc_i]] - doc_offset;
        remaining -= doc_length;
        if (remaining <= 0) {
          // The sample ends inside this document; its last token starts the next sample.
          doc_offset += remaining + doc_length - 1;
          remaining = 0;
        } else {
          ++doc_i;
          doc_offset = 0;
        }
      }
      out[2 * s] = static_cast<T>(doc_i);
      out[2 * s + 1] = static_cast<T>(doc_offset);
    }
  }
  py::capsule owner(out, [](void* p) { delete[] reinterpret_cast<T*>(p); });
  const std::vector<int64_t> shape = {num_samples + 1, 2};
  return py::array_t<T>(shape, out, owner);
}

py::array build_sample_idx(const py::array_t<int32_t>& sizes, const py::array_t<int32_t>& doc_idx,
                           int64_t seq_length, int64_t num_samples, bool use_int64) {
  if (seq_length < 1) throw std::invalid_argument("build_sample_idx: seq_length must be >= 1");
  if (num_samples < 0) throw std::invalid_argument("build_sample_idx: num_samples must be >= 0");
  if (sizes.ndim() != 1 || doc_idx.ndim() != 1)
    throw std::invalid_argument("build_sample_idx: sizes and doc_idx must be 1-D");
  if (use_int64) return build_sample_idx_impl<int64_t>(sizes, doc_idx, seq_length, num_samples);
  return build_sample_idx_impl<int32_t>(sizes, doc_idx, seq_length, num_samples);
}

// Greedy exact blending: sample i goes to the dataset whose share lags its weight the most
// (first one on ties), so after any n samples each dataset has weight * n of them, +-1.
py::tuple build_blending_indices(const py::array_t<double>& weights_, int64_t size) {
  auto weights = weights_.unchecked<1>();
  const int64_t n = weights.shape(0);
  if (n < 1 || n > 255)
    throw std::invalid_argument("build_blending_indices: need 1 to 255 datasets");
  py::array_t<uint8_t> dataset_index(size);
  py::array_t<int64_t> dataset_sample_index(size);
  auto di = dataset_index.mutable_unchecked<1>();
  auto dsi = dataset_sample_index.mutable_unchecked<1>();
  {
    py::gil_scoped_release release;
    std::vector<int64_t> counts(n, 0);
    for (int64_t i = 0; i < size; ++i) {
      const double seen = i > 1 ? static_cast<double>(i) : 1.0;
      int64_t best = 0;
      double best_error = weights(0) * seen - static_cast<double>(counts[0]);
      for (int64_t d = 1; d < n; ++d) {
        const double error = weights(d) * seen - static_cast<double>(counts[d]);
        if (error > best_error) {
          best_error = error;
          best = d;
        }
      }
      di(i) = static_cast<uint8_t>(best);
      dsi(i) = counts[best];
      ++counts[best];
    }
  }
  return py::make_tuple(dataset_index, dataset_sample_index);
}

}  // namespace

PYBIND11_MODULE(_index_helpers, m) {
  m.doc() = "Compiled GPT sample-index and blending-index builders for megatron.data";
  m.def("build_sample_idx", &build_sample_idx, py::arg("sizes"), py::arg("doc_idx"),
        py::arg("seq_length"), py::arg("num_samples"), py::arg("use_int64"));
  m.def("build_blending_indices", &build_blending_indices, py::arg("weights"), py::arg("size"));
}
