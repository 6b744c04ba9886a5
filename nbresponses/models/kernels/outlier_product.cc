// OutlierProduct (domain ai.nbresponses): the integer products' outlier channels, added in.
//
// Why: the integer recipe multiplies the few channels it keeps apart (QuantizeRows' picked, 16
// of them) by their weight rows in fp32 and adds that to the integer product's output. As a
// MatMul (K = 16) and an Add that is two nodes a product, and MLAS's SGEMM is built for large
// K: at one row it spends more time on the call than on the 16 x N products. Here: one node, one
// pass over the weight rows, shared by the rows of a step or a prompt's run.
//
// Exactness: each output element is its row's own fixed chain, acc = fma(picked[k], w[k], acc)
// for k = 0, 1, ..., then base + acc, the same in the vector lanes and the scalar tail (fma
// rounds once either way); nothing depends on other rows.
//
// Inputs: base [..., N] float (the integer product's output), picked [..., n] float, weight
// [n, N] float. Output: [..., N] float.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

using namespace nbr;

constexpr int64_t kTile = 16 * kLanes;  // columns a work item takes: its weight rows stay in L1
constexpr int64_t kRowBlock = 64;        // rows a work item takes (a prompt's run: balance)
constexpr int64_t kInline = 1 << 16;     // products below which one thread does them all

struct Job {
  const float* base;
  const float* picked;
  const float* weight;
  float* out;
  int64_t rows, N, n, tiles;
};

// One tile of columns for one block of rows: every row reads the tile's weights while they
// are in L1 (a row's elements are the same chains whichever rows share the tile).
void add_tile(void* data, size_t index) {
  const auto& j = *static_cast<const Job*>(data);
  const int64_t tile = static_cast<int64_t>(index) % j.tiles;
  const int64_t block = static_cast<int64_t>(index) / j.tiles;
  const int64_t begin = tile * kTile, end = std::min(j.N, begin + kTile);
  const int64_t full = begin + (end - begin) / (4 * kLanes) * (4 * kLanes);
  for (int64_t row = block * kRowBlock; row < std::min(j.rows, (block + 1) * kRowBlock); ++row) {
    const float* p = j.picked + row * j.n;
    const float* base = j.base + row * j.N;
    float* out = j.out + row * j.N;
    for (int64_t c = begin; c < full; c += 4 * kLanes) {  // four vectors of columns at a time
      Vec a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
      for (int64_t k = 0; k < j.n; ++k) {
        const Vec pk = broadcast(p[k]);
        const float* w = j.weight + k * j.N + c;
        a0 = fma(pk, load(w), a0);
        a1 = fma(pk, load(w + kLanes), a1);
        a2 = fma(pk, load(w + 2 * kLanes), a2);
        a3 = fma(pk, load(w + 3 * kLanes), a3);
      }
      store(out + c, add(load(base + c), a0));
      store(out + c + kLanes, add(load(base + c + kLanes), a1));
      store(out + c + 2 * kLanes, add(load(base + c + 2 * kLanes), a2));
      store(out + c + 3 * kLanes, add(load(base + c + 3 * kLanes), a3));
    }
    for (int64_t c = full; c < end; ++c) {
      float acc = 0.f;
      for (int64_t k = 0; k < j.n; ++k) acc = std::fma(p[k], j.weight[k * j.N + c], acc);
      out[c] = base[c] + acc;
    }
  }
}

struct Kernel {
  Kernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const auto base = ctx.GetInput(0), picked = ctx.GetInput(1), weight = ctx.GetInput(2);
    const auto shape = base.GetTensorTypeAndShapeInfo().GetShape();
    const auto ps = picked.GetTensorTypeAndShapeInfo().GetShape();
    const auto ws = weight.GetTensorTypeAndShapeInfo().GetShape();
    if (shape.empty() || ws.size() != 2 || ps.size() != shape.size() || ws[1] != shape.back() ||
        ps.back() != ws[0])
      ORT_CXX_API_THROW("OutlierProduct: base [..., N], picked [..., n] and weight [n, N]",
                        ORT_INVALID_ARGUMENT);
    auto out = ctx.GetOutput(0, shape);
    const int64_t N = shape.back();
    const int64_t rows = N ? static_cast<int64_t>(base.GetTensorTypeAndShapeInfo().GetElementCount()) / N : 0;
    const int64_t tiles = (N + kTile - 1) / kTile;
    Job job{base.GetTensorData<float>(), picked.GetTensorData<float>(), weight.GetTensorData<float>(),
            out.GetTensorMutableData<float>(), rows, N, ws[0], tiles};
    const int64_t items = tiles * ((rows + kRowBlock - 1) / kRowBlock);
    if (rows * N * ws[0] < kInline) {  // a decode step's small products: no hand-off to the pool
      for (int64_t i = 0; i < items; ++i) add_tile(&job, static_cast<size_t>(i));
    } else if (items > 0) {
      ctx.ParallelFor(add_tile, static_cast<size_t>(items), 0, &job);
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "OutlierProduct"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

// the operator, for register.cc
const OrtCustomOp* OutlierProductOp() {
  static const Op op;
  return &op;
}
