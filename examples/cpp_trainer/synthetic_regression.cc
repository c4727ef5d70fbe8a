#include "synthetic_regression.h"

#include <cmath>

#include "split_mix64.h"

namespace cpp_trainer {

SyntheticRegression::SyntheticRegression(int inputs, uint64_t seed)
    : inputs_(inputs),
      seed_(seed),
      teacher_in_(static_cast<size_t>(kTeacherHidden) * inputs),
      teacher_bias_(kTeacherHidden),
      teacher_out_(kTeacherHidden) {
  SplitMix64 rng(SplitMix64::Mix(seed, 0x7EAC4E5ULL));
  // Pre-activations with a standard deviation of about 2 use tanh's curved range, so the teacher is
  // far from linear and the student keeps improving well after it has fitted the linear part; the
  // output scale makes the targets' variance about 1, the loss of a student that predicts 0.
  const float in_scale = 2.0f / std::sqrt(static_cast<float>(inputs));
  for (float& w : teacher_in_) {
    w = rng.Normal() * in_scale;
  }
  for (float& b : teacher_bias_) {
    b = rng.Normal() * 0.5f;
  }
  const float out_scale = 1.6f / std::sqrt(static_cast<float>(kTeacherHidden));
  for (float& a : teacher_out_) {
    a = rng.Normal() * out_scale;
  }
}

float SyntheticRegression::Teacher(const float* x) const {
  float y = 0.0f;
  for (int k = 0; k < kTeacherHidden; ++k) {
    const float* u = &teacher_in_[static_cast<size_t>(k) * inputs_];
    float z = teacher_bias_[k];
    for (int i = 0; i < inputs_; ++i) {
      z += u[i] * x[i];
    }
    y += teacher_out_[k] * std::tanh(z);
  }
  return y;
}

Batch SyntheticRegression::Sample(int rank, int64_t step, int batch_size) const {
  Batch batch;
  batch.size = batch_size;
  batch.inputs = inputs_;
  batch.x.resize(static_cast<size_t>(batch_size) * inputs_);
  batch.y.resize(batch_size);
  SplitMix64 rng(SplitMix64::Mix(SplitMix64::Mix(seed_, static_cast<uint64_t>(rank)),
                                 static_cast<uint64_t>(step)));
  for (float& v : batch.x) {
    v = rng.Normal();
  }
  for (int n = 0; n < batch_size; ++n) {
    batch.y[n] = Teacher(&batch.x[static_cast<size_t>(n) * inputs_]);
  }
  return batch;
}

}  // namespace cpp_trainer
