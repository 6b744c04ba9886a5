// QuantizeRows (domain ai.nbresponses): the integer recipe's activation quantization in one node.
//
// Why: each integer product quantizes its input rows at run time (one scale per row, uint8 with
// zero point 128) and keeps a few outlier channels apart in fp32 (models/fused.py,
// _IntegerGraph). In standard operators that is six nodes a product (Mul by a mask, Gather,
// Abs, ReduceMax, Mul, QuantizeLinear), each its own pass over the row and its own dispatch; a
// decode step of the bundled model runs ~400 of them. This is one node and one pass, with the
// same bits: the same peak (a maximum: exact in any order), the same fp32 products and
// quotients, and ONNX Runtime's QuantizeLinear rounding (MLAS: divide, clamp with NaN to the
// lower bound, round half to even, add the zero point). A row's output depends on that row only.
//
// Inputs: x [..., K] float; apart [n] int64 (the channels kept apart, n may be 0).
// Outputs: quantized [..., K] uint8 (the apart channels quantized as zeros, 128), scale [..., 1]
// float (max |x| over the other channels times 1/127, as the graph's Mul computes it), picked
// [..., n] float (x at the apart channels).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include "simd.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using namespace nbr;

constexpr float kInv127 = static_cast<float>(1.0 / 127.0);  // np.float32(1 / 127)
constexpr int64_t kInline = 1 << 16;  // elements below which one thread quantizes them all

struct Job {
  const float* x;
  const float* keep;  // 1 or 0 per channel
  const int64_t* apart;
  uint8_t* quantized;
  float* scale;
  float* picked;
  int64_t K, n;
};

// One row, in vectors and a scalar tail that compute each element alike: x * keep, divided by
// the scale, clamped (max first: a NaN, 0 / 0 of a row of zeros, gives -128 as in MLAS),
// rounded half to even (the default rounding mode, as MLAS's conversion), plus 128.
void quantize_row(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t row = static_cast<int64_t>(index);
  const float* x = j.x + row * j.K;
  const int64_t full = j.K / kLanes * kLanes;
  Vec peaks = zero();
  for (int64_t k = 0; k < full; k += kLanes) peaks = max(abs(mul(load(x + k), load(j.keep + k))), peaks);
  alignas(64) float lanes[kLanes];
  store(lanes, peaks);
  float peak = 0.f;
  for (int i = 0; i < kLanes; ++i) peak = lanes[i] > peak ? lanes[i] : peak;  // a maximum: any order
  for (int64_t k = full; k < j.K; ++k) {
    const float a = std::fabs(x[k] * j.keep[k]);
    peak = a > peak ? a : peak;
  }
  const float scale = peak * kInv127;
  uint8_t* q = j.quantized + row * j.K;
  const Vec scales = broadcast(scale), low = broadcast(-128.f), high = broadcast(127.f);
  for (int64_t k = 0; k < full; k += kLanes)
    store_bytes(q + k, min(max(div(mul(load(x + k), load(j.keep + k)), scales), low), high));
  for (int64_t k = full; k < j.K; ++k) {
    float v = x[k] * j.keep[k] / scale;
    v = v > -128.f ? v : -128.f;
    v = v < 127.f ? v : 127.f;
    q[k] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(v)) + 128);
  }
  j.scale[row] = scale;
  for (int64_t i = 0; i < j.n; ++i) j.picked[row * j.n + i] = x[j.apart[i]];
}

struct Kernel {
  Kernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const auto x = ctx.GetInput(0), apart = ctx.GetInput(1);
    auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    const auto n = apart.GetTensorTypeAndShapeInfo().GetElementCount();
    if (shape.empty()) ORT_CXX_API_THROW("QuantizeRows: x must have a last axis", ORT_INVALID_ARGUMENT);
    const int64_t K = shape.back();
    const int64_t* channels = apart.GetTensorData<int64_t>();
    std::vector<float> keep(static_cast<size_t>(K), 1.f);
    for (size_t i = 0; i < n; ++i) {
      if (channels[i] < 0 || channels[i] >= K)
        ORT_CXX_API_THROW("QuantizeRows: apart holds a channel outside x's last axis", ORT_INVALID_ARGUMENT);
      keep[static_cast<size_t>(channels[i])] = 0.f;
    }
    auto quantized = ctx.GetOutput(0, shape);
    shape.back() = 1;
    auto scale = ctx.GetOutput(1, shape);
    shape.back() = static_cast<int64_t>(n);
    auto picked = ctx.GetOutput(2, shape);
    const int64_t rows = K ? static_cast<int64_t>(x.GetTensorTypeAndShapeInfo().GetElementCount()) / K : 0;
    Job job{x.GetTensorData<float>(), keep.data(), channels,
            quantized.GetTensorMutableData<uint8_t>(), scale.GetTensorMutableData<float>(),
            picked.GetTensorMutableData<float>(), K, static_cast<int64_t>(n)};
    if (rows * K < kInline) {  // a decode step: no hand-off to the pool
      for (int64_t row = 0; row < rows; ++row) quantize_row(&job, static_cast<size_t>(row));
    } else {
      ctx.ParallelFor(quantize_row, static_cast<size_t>(rows), 0, &job);
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "QuantizeRows"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

}  // namespace

// the operator, for register.cc
const OrtCustomOp* QuantizeRowsOp() {
  static const Op op;
  return &op;
}
