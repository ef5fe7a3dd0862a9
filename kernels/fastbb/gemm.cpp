// fastbb GEMMs through cuBLASLt: plans (descriptors, layouts and the heuristic's algorithm) are
// built once per GemmKey and reused; bias and residual are fused into the GEMM.
//
// cuBLASLt is column-major. A row-major out[m, n] = x[m, k] . w[n, k]^T is, read column-major,
// out^T[n, m] = w^T . x^T with w stored as a column-major k x n matrix (so transa = T) and x as a
// column-major k x m matrix (transb = N); the bias then runs along the rows of the column-major
// D, which is what the bias epilogue broadcasts.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <string>

#include "kernels/fastbb/fastbb.hpp"
#include "kernels/fastbb/launch.hpp"

namespace sapiens_seg::kernels::fastbb {
namespace {

[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(what) + " failed: " + cublasLtGetStatusName(s) + " (" +
                           cublasLtGetStatusString(s) + ") at " + file + ":" +
                           std::to_string(line));
}

#define SAPIENS_CUBLAS_CHECK(expr)                          \
  do {                                                      \
    const cublasStatus_t sapiens_st_ = (expr);              \
    if (sapiens_st_ != CUBLAS_STATUS_SUCCESS) {             \
      throw_cublas(sapiens_st_, #expr, __FILE__, __LINE__); \
    }                                                       \
  } while (0)

std::uint8_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t r = 16;
  while (r > 1 && (a % r) != 0) r = static_cast<std::uint8_t>(r / 2);
  return r;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

void check_matrix(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2, "linear: ", name, " must be 2-D, got ", t.sizes());
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) == 1, "linear: ", name,
              " must have unit column stride, got strides ", t.strides());
  TORCH_CHECK(t.stride(0) >= t.size(1) || t.size(0) <= 1, "linear: ", name,
              " rows overlap (strides ", t.strides(), ")");
}

std::int64_t row_stride(const at::Tensor& t) {
  // A single-row matrix may carry any row stride; cuBLASLt only needs ld >= columns.
  return t.size(0) <= 1 ? std::max<std::int64_t>(t.size(1), 1) : t.stride(0);
}

}  // namespace

std::size_t GemmKeyHash::operator()(const GemmKey& k) const noexcept {
  std::size_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (std::int64_t v : {k.m, k.n, k.k, k.ldx, k.ldw, k.ldc, k.ldo}) {
    mix(static_cast<std::uint64_t>(v));
  }
  mix(static_cast<std::uint64_t>(k.dtype) | (std::uint64_t{k.bias} << 8) |
      (std::uint64_t{k.residual} << 9) | (std::uint64_t{k.tanh_epilogue} << 10) |
      (std::uint64_t{k.align_x} << 16) | (std::uint64_t{k.align_w} << 24) |
      (std::uint64_t{k.align_c} << 32) | (std::uint64_t{k.align_o} << 40) |
      (std::uint64_t{k.align_bias} << 48));
  mix(static_cast<std::uint64_t>(k.device));
  return h;
}

GemmKey linear_key(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                   const at::Tensor& residual, Activation act, const at::Tensor& out) {
  check_matrix(x, "x");
  check_matrix(out, "out");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(),
              "linear: weight must be a contiguous [N, K] "
              "matrix, got sizes ",
              w.sizes(), " strides ", w.strides());
  const std::int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "linear: x is [", M, ", ", K, "] but weight is ", w.sizes());
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "linear: out must be [", M, ", ", N, "], got ",
              out.sizes());
  const auto t = x.scalar_type();
  TORCH_CHECK(w.scalar_type() == t && out.scalar_type() == t, "linear: x (", t, "), weight (",
              w.scalar_type(), ") and out (", out.scalar_type(), ") must share one dtype");
  GemmKey key;
  key.dtype = to_dtype(t);
  if (bias.defined()) {
    TORCH_CHECK(
        bias.dim() == 1 && bias.size(0) == N && bias.is_contiguous() && bias.scalar_type() == t,
        "linear: bias must be a contiguous [", N, "] ", t, " vector, got ", bias.sizes(), " ",
        bias.scalar_type());
  }
  if (residual.defined()) {
    check_matrix(residual, "residual");
    TORCH_CHECK(residual.size(0) == M && residual.size(1) == N && residual.scalar_type() == t,
                "linear: residual must be [", M, ", ", N, "] ", t, ", got ", residual.sizes(), " ",
                residual.scalar_type());
    const bool same = residual.data_ptr() == out.data_ptr();
    TORCH_CHECK(!same || row_stride(residual) == row_stride(out),
                "linear: an in-place residual must have the output's layout");
  }
  if (act == Activation::kGeluErf) {
    TORCH_CHECK(out.is_contiguous(), "linear: the erf GELU needs a contiguous output");
  }
  for (const at::Tensor* o : {&w, &bias, &residual, &out}) {
    TORCH_CHECK(!o->defined() || o->device() == x.device(),
                "linear: all operands must be on one device (x is on ", x.device(), ")");
  }
  key.m = M;
  key.n = N;
  key.k = K;
  key.ldx = row_stride(x);
  key.ldw = K;
  key.ldo = row_stride(out);
  key.ldc = residual.defined() ? row_stride(residual) : key.ldo;
  key.bias = bias.defined();
  key.residual = residual.defined();
  key.tanh_epilogue = act == Activation::kGeluTanhEpilogue;
  key.align_x = alignment(x.const_data_ptr());
  key.align_w = alignment(w.const_data_ptr());
  key.align_o = alignment(out.const_data_ptr());
  key.align_c = residual.defined() ? alignment(residual.const_data_ptr()) : key.align_o;
  key.align_bias = bias.defined() ? alignment(bias.const_data_ptr()) : 0;
  key.device = x.device().is_cuda() ? x.device().index() : -1;
  return key;
}

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};

  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Gemm::Gemm(c10::Device device, std::size_t workspace_bytes) : device_(device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "Gemm: needs a CUDA device with an index");
  const c10::cuda::CUDAGuard guard(device);
  cublasLtHandle_t h = nullptr;
  SAPIENS_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_ = at::empty({static_cast<std::int64_t>(workspace_bytes)},
                         at::TensorOptions().dtype(at::kByte).device(device));
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

std::size_t Gemm::plans_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

Gemm::Plan& Gemm::plan_for(const GemmKey& key, const void* bias) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_type(key.dtype);
  SAPIENS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  SAPIENS_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  SAPIENS_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (key.bias) {
    epi = key.tanh_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  } else if (key.tanh_epilogue) {
    epi = CUBLASLT_EPILOGUE_GELU;
  }
  SAPIENS_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (key.bias) {
    // The heuristic reads the bias pointer's alignment (the key holds it), so set it first.
    SAPIENS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof bias));
  }
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  SAPIENS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, u(key.k), u(key.n), key.ldw));
  SAPIENS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, u(key.k), u(key.m), key.ldx));
  SAPIENS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, type, u(key.n), u(key.m), key.ldc));
  SAPIENS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, type, u(key.n), u(key.m), key.ldo));

  cublasLtMatmulPreference_t pref = nullptr;
  SAPIENS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = static_cast<std::uint64_t>(workspace_.numel());
  const std::uint32_t al[4] = {key.align_w, key.align_x, key.align_c, key.align_o};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
  }
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b,
                                        p->c, p->d, pref, 1, &p->heuristic, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  SAPIENS_CUBLAS_CHECK(st);
  TORCH_CHECK(found > 0, "linear: cuBLASLt has no algorithm for m=", key.m, " n=", key.n,
              " k=", key.k, " ", dtype_str(key.dtype));
  return *plans_.emplace(key, std::move(p)).first->second;
}

void Gemm::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                  const at::Tensor& residual, Activation act, const at::Tensor& out) {
  const GemmKey key = linear_key(x, w, bias, residual, act, out);
  TORCH_CHECK(x.device() == device_, "linear: operands are on ", x.device(),
              " but this Gemm serves ", device_);
  if (key.m == 0 || key.n == 0) return;
  const c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device_.index());
  {
    // The bias pointer is an attribute of the shared descriptor: set and enqueue under one lock.
    std::lock_guard<std::mutex> lock(mu_);
    const void* b = bias.defined() ? bias.const_data_ptr() : nullptr;
    Plan& p = plan_for(key, b);
    if (bias.defined()) {
      SAPIENS_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
    }
    const float alpha = 1.f, beta = residual.defined() ? 1.f : 0.f;
    const void* c = residual.defined() ? residual.const_data_ptr() : out.const_data_ptr();
    SAPIENS_CUBLAS_CHECK(cublasLtMatmul(
        static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, w.const_data_ptr(), p.a,
        x.const_data_ptr(), p.b, &beta, c, p.c, out.data_ptr(), p.d, &p.heuristic.algo,
        workspace_.data_ptr(), static_cast<std::size_t>(workspace_.numel()), stream));
  }
  if (act == Activation::kGeluErf) {
    launch_gelu_erf(key.dtype, out.data_ptr(), out.numel(), stream);
  }
}

}  // namespace sapiens_seg::kernels::fastbb
