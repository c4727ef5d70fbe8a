#include "parallel_mlp.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "examples/cpp_trainer/split_mix64.h"

namespace megatron_like {
namespace {

using cpp_trainer::SplitMix64;

// The initial value of element `index` of matrix `matrix` (0: W1, 1: b1, 2: W2, 3: b2) of global
// block `layer`, uniform in [-limit, limit).
float InitialValue(uint64_t seed, int layer, int matrix, uint64_t index, float limit) {
  SplitMix64 rng(
      SplitMix64::Mix(SplitMix64::Mix(seed, static_cast<uint64_t>(layer) * 4 + matrix), index));
  return rng.Symmetric(limit);
}

}  // namespace

size_t ParallelMlp::Size(const MlpShape& shape) {
  const size_t local_ffn = shape.ffn / shape.tp;
  return (2 * local_ffn * shape.hidden + local_ffn + shape.hidden) * shape.blocks_per_stage;
}

ParallelMlp::ParallelMlp(const MlpShape& shape, uint64_t seed, std::span<float> params)
    : shape_(shape),
      local_ffn_(shape.ffn / shape.tp),
      block_size_(Size(shape) / shape.blocks_per_stage),
      params_(params.first(Size(shape))),
      grads_(params_.size(), 0.0f) {
  const int h = shape_.hidden;
  const float w1_limit = 1.0f / std::sqrt(static_cast<float>(h));
  const float w2_limit = 1.0f / std::sqrt(static_cast<float>(shape_.ffn));
  for (int block = 0; block < shape_.blocks_per_stage; ++block) {
    const int layer = shape_.first_block + block;
    const Offsets o = BlockOffsets(block);
    for (int j = 0; j < local_ffn_; ++j) {
      const uint64_t row = static_cast<uint64_t>(shape_.tp_rank) * local_ffn_ + j;
      for (int k = 0; k < h; ++k) {
        params_[o.w1 + j * h + k] = InitialValue(seed, layer, 0, row * h + k, w1_limit);
      }
      params_[o.b1 + j] = InitialValue(seed, layer, 1, row, 0.1f);
    }
    for (int i = 0; i < h; ++i) {
      for (int j = 0; j < local_ffn_; ++j) {
        const uint64_t column = static_cast<uint64_t>(shape_.tp_rank) * local_ffn_ + j;
        params_[o.w2 + i * local_ffn_ + j] =
            InitialValue(seed, layer, 2, static_cast<uint64_t>(i) * shape_.ffn + column, w2_limit);
      }
      params_[o.b2 + i] = InitialValue(seed, layer, 3, i, 0.1f);
    }
  }
}

ParallelMlp::Offsets ParallelMlp::BlockOffsets(int block) const {
  const size_t base = block_size_ * block;
  const size_t w1 = static_cast<size_t>(local_ffn_) * shape_.hidden;
  return {base, base + w1, base + w1 + local_ffn_, base + 2 * w1 + local_ffn_};
}

void ParallelMlp::ZeroGradients() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void ParallelMlp::Forward(int micro, std::span<float> x, int rows, const TpAllreduce& allreduce,
                          const PartialCheck& check, int64_t poison) {
  if (static_cast<int>(saved_.size()) <= micro) saved_.resize(micro + 1);
  Saved& saved = saved_[micro];
  const int h = shape_.hidden;
  const int f = local_ffn_;
  saved.input.resize(static_cast<size_t>(shape_.blocks_per_stage) * rows * h);
  saved.hidden.resize(static_cast<size_t>(shape_.blocks_per_stage) * rows * f);
  std::vector<float> partial(static_cast<size_t>(rows) * h);
  for (int block = 0; block < shape_.blocks_per_stage; ++block) {
    const Offsets o = BlockOffsets(block);
    float* in = saved.input.data() + static_cast<size_t>(block) * rows * h;
    float* act = saved.hidden.data() + static_cast<size_t>(block) * rows * f;
    std::copy(x.begin(), x.begin() + static_cast<size_t>(rows) * h, in);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < f; ++j) {
        float a = params_[o.b1 + j];
        for (int k = 0; k < h; ++k) a += params_[o.w1 + j * h + k] * in[r * h + k];
        act[r * f + j] = std::tanh(a);
      }
    }
    if (block == 0 && poison >= 0) {
      act[poison % (static_cast<int64_t>(rows) * f)] = std::numeric_limits<float>::quiet_NaN();
    }
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < h; ++i) {
        float z = 0.0f;
        for (int j = 0; j < f; ++j) z += params_[o.w2 + i * f + j] * act[r * f + j];
        partial[r * h + i] = z;
      }
    }
    check(block, std::span<const float>(in, static_cast<size_t>(rows) * h), partial);
    allreduce(partial);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < h; ++i)
        x[r * h + i] = in[r * h + i] + partial[r * h + i] + params_[o.b2 + i];
    }
  }
}

void ParallelMlp::Backward(int micro, std::span<float> dy, int rows, const TpAllreduce& allreduce) {
  const Saved& saved = saved_[micro];
  const int h = shape_.hidden;
  const int f = local_ffn_;
  std::vector<float> da(static_cast<size_t>(rows) * f);
  std::vector<float> dx(static_cast<size_t>(rows) * h);
  for (int block = shape_.blocks_per_stage - 1; block >= 0; --block) {
    const Offsets o = BlockOffsets(block);
    const float* in = saved.input.data() + static_cast<size_t>(block) * rows * h;
    const float* act = saved.hidden.data() + static_cast<size_t>(block) * rows * f;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < h; ++i) grads_[o.b2 + i] += dy[r * h + i];
    }
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < f; ++j) {
        float dh = 0.0f;
        for (int i = 0; i < h; ++i) {
          grads_[o.w2 + i * f + j] += dy[r * h + i] * act[r * f + j];
          dh += params_[o.w2 + i * f + j] * dy[r * h + i];
        }
        const float t = act[r * f + j];
        da[r * f + j] = dh * (1.0f - t * t);
        grads_[o.b1 + j] += da[r * f + j];
      }
    }
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < h; ++k) {
        float g = 0.0f;
        for (int j = 0; j < f; ++j) {
          grads_[o.w1 + j * h + k] += da[r * f + j] * in[r * h + k];
          g += params_[o.w1 + j * h + k] * da[r * f + j];
        }
        dx[r * h + k] = g;
      }
    }
    allreduce(dx);
    for (size_t i = 0; i < dx.size(); ++i) dy[i] += dx[i];
  }
}

}  // namespace megatron_like
