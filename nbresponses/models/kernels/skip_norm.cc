// SkipNorm (domain ai.nbresponses): RMSNorm of x (+ skip), and the sum, in one pass.
//
// Why: ONNX Runtime's SkipSimplifiedLayerNormalization and SimplifiedLayerNormalization run a
// row's sums in scalar double precision: ~0.6 us a row of 576 (~1 ns an element), 61 nodes a
// step. Here a row's squares are summed in 16 float lanes; the rows are spread over the pool
// only when there are enough of them to pay for the hand-off. The bundled model's graph with it
// (benchmarks/README.md): a 16-row step 3-6% faster, a 370-token prefill 3%, one row 2.5%.
//
// Exactness: a row reads only itself, and its bits are fixed by the definition, whatever the
// vector width, the rows or the threads: sum[k] = x[k] + skip[k]; lane i accumulates
// fma(sum[k], sum[k], lane i) for k = i, i + 16, ... in order; the 16 lanes are added in a
// fixed tree (lane i += lane i + 8, then + 4, + 2, + 1); mean = total / H; inv = 1 / sqrt(mean +
// epsilon); out[k] = (sum[k] * inv) * gamma[k]. The AVX2 code keeps the 16 lanes as two vectors.
//
// Inputs: x [..., H] float; optional skip [..., H] float (absent: the sum is x); gamma [H]
// float. Attribute: epsilon. Outputs: the normed rows [..., H]; optional the sums [..., H]
// (the residual stream, for the next layer).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

using namespace nbr;

constexpr int64_t kWidth = 16;          // lanes of the sum of squares, any vector width
constexpr int64_t kInline = 64 * 1024;  // elements below which one thread does them all

struct Job {
  const float* x;
  const float* skip;  // or nullptr
  const float* gamma;
  float* out;
  float* total;  // the sums, or nullptr
  int64_t rows, H, per_task;
  float epsilon;
};

void norm_row(const Job& j, int64_t row) {
  const float* x = j.x + row * j.H;
  const float* skip = j.skip ? j.skip + row * j.H : nullptr;
  float* out = j.out + row * j.H;
  // the sums in place in the output when they are not asked for (read back below)
  float* sum = j.total ? j.total + row * j.H : out;
  const int64_t full = j.H / kWidth * kWidth;
  alignas(64) float lanes[kWidth];
#if defined(__AVX512F__)
  Vec acc = zero();
  for (int64_t k = 0; k < full; k += kWidth) {
    const Vec s = skip ? add(load(x + k), load(skip + k)) : load(x + k);
    store(sum + k, s);
    acc = fma(s, s, acc);
  }
  store(lanes, acc);
#else
  Vec low = zero(), high = zero();  // lanes 0-7 and 8-15
  for (int64_t k = 0; k < full; k += kWidth) {
    const Vec a = skip ? add(load(x + k), load(skip + k)) : load(x + k);
    const Vec b = skip ? add(load(x + k + 8), load(skip + k + 8)) : load(x + k + 8);
    store(sum + k, a);
    store(sum + k + 8, b);
    low = fma(a, a, low);
    high = fma(b, b, high);
  }
  store(lanes, low);
  store(lanes + 8, high);
#endif
  for (int64_t k = full; k < j.H; ++k) {
    const float s = skip ? x[k] + skip[k] : x[k];
    sum[k] = s;
    lanes[k - full] = std::fma(s, s, lanes[k - full]);
  }
  for (int64_t width = kWidth / 2; width > 0; width /= 2)
    for (int64_t i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  const float mean = lanes[0] / static_cast<float>(j.H);
  const float inv = 1.f / std::sqrt(mean + j.epsilon);
  const Vec scale = broadcast(inv);
  int64_t k = 0;
  for (; k + kLanes <= j.H; k += kLanes) store(out + k, mul(mul(load(sum + k), scale), load(j.gamma + k)));
  for (; k < j.H; ++k) out[k] = (sum[k] * inv) * j.gamma[k];
}

void task(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t first = static_cast<int64_t>(index) * j.per_task;
  for (int64_t row = first; row < std::min(j.rows, first + j.per_task); ++row) norm_row(j, row);
}

struct Kernel {
  float epsilon;

  Kernel(const OrtApi&, const OrtKernelInfo* info) {
    epsilon = Ort::ConstKernelInfo(info).GetAttribute<float>("epsilon");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const auto x = ctx.GetInput(0), skip = ctx.GetInput(1), gamma = ctx.GetInput(2);
    const auto shape = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t H = shape.empty() ? 0 : shape.back();
    const bool skipped = static_cast<bool>(skip);
    if (H == 0 || (skipped && skip.GetTensorTypeAndShapeInfo().GetShape() != shape) ||
        gamma.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(H))
      ORT_CXX_API_THROW("SkipNorm: x [..., H], skip as x (or none), gamma [H]",
                        ORT_INVALID_ARGUMENT);
    const int64_t count = static_cast<int64_t>(x.GetTensorTypeAndShapeInfo().GetElementCount());
    float* out = ctx.GetOutput(0, shape).GetTensorMutableData<float>();
    float* total = nullptr;
    if (ctx.GetOutputCount() > 1) {
      auto second = ctx.GetOutput(1, shape);
      if (second) total = second.GetTensorMutableData<float>();
    }
    Job job{x.GetTensorData<float>(), skipped ? skip.GetTensorData<float>() : nullptr,
            gamma.GetTensorData<float>(), out, total, count / H, H, 1, epsilon};
    if (count < kInline) {
      for (int64_t row = 0; row < job.rows; ++row) norm_row(job, row);
      return;
    }
    job.per_task = std::max<int64_t>(1, kInline / 4 / H);  // ~16K elements a task
    const int64_t tasks = (job.rows + job.per_task - 1) / job.per_task;
    ctx.ParallelFor(task, static_cast<size_t>(tasks), 0, &job);
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "SkipNorm"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i >= 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
};

}  // namespace

// the operator, for register.cc
const OrtCustomOp* SkipNormOp() {
  static const Op op;
  return &op;
}
