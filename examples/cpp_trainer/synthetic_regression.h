// SyntheticRegression: the example trainer's data set, a regression task with a known answer.
//
// Targets come from a fixed random "teacher" network y = sum_k a_k * tanh(u_k . x + c_k), drawn
// once from the task seed, so a student MLP can fit it and its loss has somewhere to go. Inputs are
// standard normal, drawn from a seed derived from (task seed, rank, step): every data-parallel rank
// sees its own shard of every step, and a rank that replays a step (after a recovery, on another
// machine) sees exactly the same batch.
//
// Thread safety: Sample() is const and may be called from any thread.
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_SYNTHETIC_REGRESSION_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_SYNTHETIC_REGRESSION_H_

#include <cstdint>
#include <vector>

namespace cpp_trainer {

// `size` examples of `inputs` features, row-major, and one target each.
struct Batch {
  int size = 0;
  int inputs = 0;
  std::vector<float> x;  // size * inputs
  std::vector<float> y;  // size
};

class SyntheticRegression {
 public:
  // REQUIRES: inputs >= 1.
  SyntheticRegression(int inputs, uint64_t seed);

  int inputs() const { return inputs_; }

  // The batch of `batch_size` examples that data-parallel rank `rank` trains on at `step`.
  Batch Sample(int rank, int64_t step, int batch_size) const;

 private:
  static constexpr int kTeacherHidden = 8;

  float Teacher(const float* x) const;

  const int inputs_;
  const uint64_t seed_;
  std::vector<float> teacher_in_;    // kTeacherHidden x inputs_
  std::vector<float> teacher_bias_;  // kTeacherHidden
  std::vector<float> teacher_out_;   // kTeacherHidden
};

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_SYNTHETIC_REGRESSION_H_
