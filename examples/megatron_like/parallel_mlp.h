// ParallelMlp: the megatron_like example's model, one pipeline stage's share of a stack of
// transformer MLP blocks split across a tensor-parallel group the way Megatron-LM splits them.
//
// Each block maps a micro-batch of activations x (rows of `hidden` floats) to
//
//     y = x + W2 tanh(W1 x + b1) + b2
//
// with W1 (ffn x hidden) column-parallel and W2 (hidden x ffn) row-parallel: tensor-parallel rank t
// of T holds rows [t*ffn/T, (t+1)*ffn/T) of W1 and b1 and the same columns of W2, computes its
// partial W2_t tanh(W1_t x + b1_t), and the group's allreduce of the partials gives W2 tanh(...);
// b2 and the residual are replicated. The backward pass needs the mirror allreduce: the gradient
// of x is the sum over the group of W1_t^T (dy * tanh'). Two allreduces per block and micro-batch,
// as in Megatron (its g and f operators), are what this class leaves to its caller (`allreduce`).
//
// The parameters of the stage's blocks live in one flat buffer the caller owns (its registered
// state, updated in place by the distributed optimizer), their gradients in another of the same
// layout (gradients()), so that the data-parallel reduce-scatter and the optimizer work on flat
// shards. Initial values depend on the seed and on each value's place in the
// whole model (its global layer, its row and column in the unsplit matrix) only: the same model,
// whatever the tensor and pipeline degrees.
//
// Thread safety: none; one training thread.
#ifndef TRAINGUARD_EXAMPLES_MEGATRON_LIKE_PARALLEL_MLP_H_
#define TRAINGUARD_EXAMPLES_MEGATRON_LIKE_PARALLEL_MLP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace megatron_like {

struct MlpShape {
  int hidden = 32;  // the model's width
  int ffn = 128;    // the blocks' inner width (divisible by the tensor-parallel degree)
  int blocks_per_stage = 2;
  int tp = 1;  // tensor-parallel degree
  int tp_rank = 0;
  int first_block = 0;  // the global index of this stage's first block
};

// Sums `data` over the tensor-parallel group, in place (the caller's tracked collective).
using TpAllreduce = std::function<void(std::span<float> data)>;
// Called with each block's input and its local partial before the forward allreduce: the caller
// checks them (a non-finite partial from a finite input was born on this rank, and is named here,
// before the allreduce spreads it to the group).
using PartialCheck =
    std::function<void(int block, std::span<const float> input, std::span<const float> partial)>;

class ParallelMlp {
 public:
  // Floats of the stage's parameters (the buffer the constructor is given holds at least these).
  static size_t Size(const MlpShape& shape);
  // Writes the initial parameters into params.first(Size(shape)), and computes with that buffer
  // from then on: it must outlive this object.
  ParallelMlp(const MlpShape& shape, uint64_t seed, std::span<float> params);

  // Forward of one micro-batch of `rows` rows: `x` is overwritten by the stage's output. Saves what
  // Backward needs under `micro`. `poison` (tests): when >= 0, the value at that index of the first
  // block's activation tanh(W1 x + b1) becomes NaN, as a faulty kernel would leave it.
  void Forward(int micro, std::span<float> x, int rows, const TpAllreduce& allreduce,
               const PartialCheck& check, int64_t poison = -1);
  // Backward of micro-batch `micro`: `dy` (the gradient of the stage's output) is overwritten by
  // the gradient of its input; the parameters' gradients are added to gradients().
  void Backward(int micro, std::span<float> dy, int rows, const TpAllreduce& allreduce);

  std::span<const float> gradients() const { return grads_; }
  size_t size() const { return params_.size(); }
  void ZeroGradients();

 private:
  struct Saved {
    std::vector<float> input;   // per block: x (rows x hidden)
    std::vector<float> hidden;  // per block: tanh(W1 x + b1) (rows x ffn/tp)
  };
  struct Offsets {
    size_t w1, b1, w2, b2;
  };
  Offsets BlockOffsets(int block) const;

  const MlpShape shape_;
  const int local_ffn_;
  const size_t block_size_;
  const std::span<float> params_;  // the caller's
  std::vector<float> grads_;
  std::vector<Saved> saved_;  // per micro-batch
};

}  // namespace megatron_like

#endif  // TRAINGUARD_EXAMPLES_MEGATRON_LIKE_PARALLEL_MLP_H_
