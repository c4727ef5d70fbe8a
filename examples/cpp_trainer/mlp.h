// Mlp: the example trainer's model, a two-layer perceptron  x -> tanh(W1 x + b1) -> w2 . h + b2,
// trained on mean squared error, with its forward and backward passes written out by hand.
//
// The parameters live in one contiguous float32 buffer (W1 row-major, b1, w2, b2), and so do the
// gradients, in the same layout: that is the flat buffer a data-parallel trainer reduces across
// ranks in one collective and the byte range a checkpoint (or a checksum) covers. Two Mlps built
// from the same shape and seed are bit-identical, which is how every data-parallel replica starts.
//
// Thread safety: none; an Mlp belongs to the training thread.
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_MLP_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_MLP_H_

#include <cstdint>
#include <span>
#include <vector>

#include "synthetic_regression.h"

namespace cpp_trainer {

class Mlp {
 public:
  // Xavier-uniform weights drawn from `seed`, zero biases. REQUIRES: inputs >= 1, hidden >= 1.
  Mlp(int inputs, int hidden, uint64_t seed);

  int inputs() const { return inputs_; }
  int hidden() const { return hidden_; }

  // Runs `batch` forward and backward. Returns the batch's mean squared error and leaves its
  // gradient with respect to every parameter in gradients(). A non-finite input gives a non-finite
  // loss (and gradients); detecting that is the caller's job. REQUIRES: batch.inputs == inputs().
  float ForwardBackward(const Batch& batch);

  // Plain SGD: parameters -= learning_rate * gradients. REQUIRES: gradients.size() ==
  // parameters().size().
  void ApplySgd(std::span<const float> gradients, float learning_rate);

  std::span<const float> parameters() const { return parameters_; }
  // For receiving the parameters from another replica (state sync after a rank replacement).
  std::span<float> mutable_parameters() { return parameters_; }
  std::span<const float> gradients() const { return gradients_; }

 private:
  // Offsets of the tensors inside the flat buffers.
  size_t w1() const { return 0; }
  size_t b1() const { return static_cast<size_t>(hidden_) * inputs_; }
  size_t w2() const { return b1() + hidden_; }
  size_t b2() const { return w2() + hidden_; }

  const int inputs_;
  const int hidden_;
  std::vector<float> parameters_;
  std::vector<float> gradients_;
  std::vector<float> activations_;  // scratch: the hidden layer of one example
};

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_MLP_H_
