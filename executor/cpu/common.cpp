// Helpers shared by the CPU kernels: allocation through the context, staging between bf16/fp32
// tensors and fp32 Eigen matrices (one rounding on the way out), gradient-input bookkeeping.
#include <cstring>
#include <stdexcept>
#include <string>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

void fail(const std::string& what) {
  throw std::invalid_argument("cpu backend: " + what);
}
void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

Tensor Env::alloc(const TensorType& type, AllocRole role) const {
  check(static_cast<bool>(ctx.alloc), "the context has no allocator");
  Tensor t = ctx.alloc(type, role);
  check(t.data != nullptr || type.elements() == 0, "the allocator returned no memory");
  t.type = type;
  return t;
}

int64_t Env::first_row(int64_t rows) const {
  return first_token_row(ctx, rows);
}

Communicator& Env::comm() const {
  check(ctx.comm != nullptr, "a collective needs a communicator in the context");
  return *ctx.comm;
}

int64_t dim(const Tensor& t, size_t i) {
  if (i >= t.type.shape.size()) fail("a tensor has fewer dimensions than the op needs");
  return t.type.shape[i];
}

int64_t row_width(const Tensor& t) {
  int64_t r = dim(t, 0);
  return r == 0 ? 0 : t.numel() / r;
}

const Tensor& need(Ins ts, size_t i, const char* what) {
  if (i >= ts.size() || !ts[i]) fail(std::string("missing tensor: ") + what);
  return ts[i];
}

bool is_float(Dtype d) {
  return d == Dtype::kBf16 || d == Dtype::kFp32;
}

Mat load_rows(const Tensor& t, int64_t rows, int64_t cols, int64_t offset) {
  check(is_float(t.type.dtype), "a float tensor was expected");
  check(offset + rows * cols <= t.numel(), "a block lies outside its tensor");
  Mat m(rows, cols);
  float* d = m.data();
  if (t.type.dtype == Dtype::kFp32) {
    std::memcpy(d, t.as<float>() + offset, sizeof(float) * rows * cols);
  } else {
    const uint16_t* s = t.as<uint16_t>() + offset;
    for (int64_t i = 0; i < rows * cols; ++i) d[i] = bf16_to_f32(s[i]);
  }
  return m;
}

Mat load_mat(const Tensor& t) {
  return load_rows(t, dim(t, 0), row_width(t));
}

Mat load_vec(const Tensor& t) {
  return load_rows(t, 1, t.numel());
}

void store_mat(const Tensor& t, const Mat& m, int64_t offset) {
  check(offset + m.size() <= t.numel(), "a result lies outside its tensor");
  const float* s = m.data();
  for (int64_t i = 0; i < m.size(); ++i) store(t, offset + i, s[i]);
}

void add_mat(const Tensor& t, const Mat& m, int64_t offset) {
  check(offset + m.size() <= t.numel(), "a result lies outside its tensor");
  const float* s = m.data();
  for (int64_t i = 0; i < m.size(); ++i) accumulate(t, offset + i, s[i]);
}

Mat column_sums(const Mat& m) {
  Mat s(1, m.cols());
  for (int64_t c = 0; c < m.cols(); ++c) {
    double acc = 0;
    for (int64_t r = 0; r < m.rows(); ++r) acc += m(r, c);
    s(0, c) = static_cast<float>(acc);
  }
  return s;
}

void grad_input(const Env& env, const BackwardArgs& args, int k, const TensorType& type,
                const Mat& g) {
  check(static_cast<size_t>(k) < args.grad_inputs.size(),
        "grad_inputs is shorter than the op's inputs");
  check(g.size() == type.elements(), "a gradient has the wrong number of elements");
  Tensor& dst = args.grad_inputs[k];
  if (dst) {
    check(dst.numel() == type.elements(), "an existing input gradient has the wrong size");
    add_mat(dst, g);
  } else {
    dst = env.alloc(type, AllocRole::kGradInput);
    store_mat(dst, g);
  }
}

void grad_input_tensor(const Env& env, const BackwardArgs& args, int k, const Tensor& g) {
  check(static_cast<size_t>(k) < args.grad_inputs.size(),
        "grad_inputs is shorter than the op's inputs");
  Tensor& dst = args.grad_inputs[k];
  if (dst) {
    check(dst.numel() == g.numel() && is_float(g.type.dtype),
          "an existing input gradient has the wrong size");
    for (int64_t i = 0; i < g.numel(); ++i) accumulate(dst, i, load(g, i));
  } else {
    dst = env.alloc(g.type, AllocRole::kGradInput);
    std::memcpy(dst.data, g.data, g.bytes());
  }
}

Scratch::Scratch(const TensorType& type)
    : mem((type.bytes() + 7) / 8 + 1, 0), t{mem.data(), type} {}

Routing routing(const Env& env, const Tensor& idx) {
  check(idx.type.dtype == Dtype::kI64, "routing indices must be i64");
  const OpAttrs& a = env.attrs();
  const int64_t local = a.experts, ep = a.group, all = local * ep, C = a.capacity;
  Routing r;
  r.tokens = dim(idx, 0), r.k = dim(idx, 1);
  const int64_t* id = idx.as<int64_t>();
  const int64_t n = r.tokens * r.k;
  std::vector<int64_t> count(static_cast<size_t>(all), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= all) fail("a routing index is outside the experts");
    ++count[id[i]];
  }
  r.row.resize(static_cast<size_t>(n));
  if (C > 0) {
    std::vector<int64_t> used(static_cast<size_t>(all), 0);
    for (int64_t i = 0; i < n; ++i)  // token order: (t, j) ascending
      r.row[i] = used[id[i]] < C ? id[i] * C + used[id[i]]++ : -1;
    r.rows = all * C;
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < local; ++e) r.segments.push_back({e, (s * local + e) * C, C});
    return r;
  }
  if (ep > 1)
    fail("dropless routing over ep > 1 ranks has data-dependent all-to-all sizes; expert "
         "parallelism runs with a capacity factor");
  std::vector<int64_t> next(static_cast<size_t>(all), 0);
  for (int64_t e = 0; e < all; ++e) {
    next[e] = r.rows;
    r.segments.push_back({e, r.rows, count[e]});
    r.rows += count[e];
  }
  for (int64_t i = 0; i < n; ++i) r.row[i] = next[id[i]]++;  // (t, j) ascending within an expert
  return r;
}

}  // namespace np::exec::cpu
