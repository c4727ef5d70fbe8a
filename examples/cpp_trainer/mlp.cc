#include "mlp.h"

#include <algorithm>
#include <cmath>

#include "split_mix64.h"

namespace cpp_trainer {

Mlp::Mlp(int inputs, int hidden, uint64_t seed)
    : inputs_(inputs),
      hidden_(hidden),
      parameters_(static_cast<size_t>(hidden) * inputs + 2 * static_cast<size_t>(hidden) + 1, 0.0f),
      gradients_(parameters_.size(), 0.0f),
      activations_(hidden) {
  SplitMix64 rng(seed);
  const float limit1 = std::sqrt(6.0f / static_cast<float>(inputs + hidden));
  for (size_t i = w1(); i < b1(); ++i) {
    parameters_[i] = rng.Symmetric(limit1);
  }
  const float limit2 = std::sqrt(6.0f / static_cast<float>(hidden + 1));
  for (size_t i = w2(); i < b2(); ++i) {
    parameters_[i] = rng.Symmetric(limit2);
  }
}

float Mlp::ForwardBackward(const Batch& batch) {
  std::fill(gradients_.begin(), gradients_.end(), 0.0f);
  const float* w1_p = &parameters_[w1()];
  const float* b1_p = &parameters_[b1()];
  const float* w2_p = &parameters_[w2()];
  const float b2_v = parameters_[b2()];
  float* g_w1 = &gradients_[w1()];
  float* g_b1 = &gradients_[b1()];
  float* g_w2 = &gradients_[w2()];
  float& g_b2 = gradients_[b2()];
  float* h = activations_.data();

  double squared_error = 0.0;
  const float d_mean = 2.0f / static_cast<float>(batch.size);  // d(mean of e^2)/de, without the e
  for (int n = 0; n < batch.size; ++n) {
    const float* x = &batch.x[static_cast<size_t>(n) * inputs_];
    // Forward.
    float prediction = b2_v;
    for (int j = 0; j < hidden_; ++j) {
      const float* row = w1_p + static_cast<size_t>(j) * inputs_;
      float z = b1_p[j];
      for (int i = 0; i < inputs_; ++i) {
        z += row[i] * x[i];
      }
      h[j] = std::tanh(z);
      prediction += w2_p[j] * h[j];
    }
    const float error = prediction - batch.y[n];
    squared_error += static_cast<double>(error) * error;
    // Backward.
    const float d_prediction = d_mean * error;
    g_b2 += d_prediction;
    for (int j = 0; j < hidden_; ++j) {
      g_w2[j] += d_prediction * h[j];
      const float d_z = d_prediction * w2_p[j] * (1.0f - h[j] * h[j]);  // tanh' = 1 - tanh^2
      g_b1[j] += d_z;
      float* g_row = g_w1 + static_cast<size_t>(j) * inputs_;
      for (int i = 0; i < inputs_; ++i) {
        g_row[i] += d_z * x[i];
      }
    }
  }
  return static_cast<float>(squared_error / batch.size);
}

void Mlp::ApplySgd(std::span<const float> gradients, float learning_rate) {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i] -= learning_rate * gradients[i];
  }
}

}  // namespace cpp_trainer
