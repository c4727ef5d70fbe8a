// StateRegistry: what a valid registration is, and what the layout hash depends on.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

StateBuffer F32Buffer(std::string name, std::vector<float>* data) {
  StateBuffer buffer;
  buffer.name = std::move(name);
  buffer.group = "model";
  buffer.data = data->data();
  buffer.bytes = data->size() * sizeof(float);
  buffer.dtype = DType::kF32;
  buffer.shape = {static_cast<int64_t>(data->size())};
  return buffer;
}

TEST(StateRegistryTest, AcceptsWellFormedBuffersAndSumsTheirBytes) {
  std::vector<float> a(1000), b(24);
  StateRegistry registry;
  ASSERT_TRUE(registry.Register(F32Buffer("a", &a)).ok());
  StateBuffer shaped = F32Buffer("b", &b);
  shaped.shape = {2, 3, 4};
  ASSERT_TRUE(registry.Register(shaped).ok());
  EXPECT_EQ(registry.buffers().size(), 2u);
  EXPECT_EQ(registry.total_bytes(), 1024 * sizeof(float));
}

TEST(StateRegistryTest, RejectsAnEmptyName) {
  std::vector<float> a(4);
  StateRegistry registry;
  absl::Status status = registry.Register(F32Buffer("", &a));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("empty"));
}

TEST(StateRegistryTest, RejectsADuplicateNameNamingIt) {
  std::vector<float> a(4), b(4);
  StateRegistry registry;
  ASSERT_TRUE(registry.Register(F32Buffer("layer0.weight", &a)).ok());
  absl::Status status = registry.Register(F32Buffer("layer0.weight", &b));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"layer0.weight\""));
  EXPECT_THAT(status.message(), HasSubstr("twice"));
}

TEST(StateRegistryTest, RejectsANullPointerWithBytesNamingTheBuffer) {
  StateBuffer buffer;
  buffer.name = "optimizer.exp_avg";
  buffer.bytes = 64;
  StateRegistry registry;
  absl::Status status = registry.Register(buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"optimizer.exp_avg\""));
  EXPECT_THAT(status.message(), HasSubstr("null"));
}

TEST(StateRegistryTest, RejectsAShapeThatDoesNotMatchTheBytes) {
  std::vector<float> a(12);
  StateBuffer buffer = F32Buffer("critic.weight", &a);
  buffer.shape = {3, 5};  // 15 floats, 60 bytes; the buffer has 48
  StateRegistry registry;
  absl::Status status = registry.Register(buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"critic.weight\""));
  EXPECT_THAT(status.message(), HasSubstr("60 bytes"));
  EXPECT_THAT(status.message(), HasSubstr("48 bytes"));

  buffer.shape = {-3, -4};
  EXPECT_EQ(registry.Register(buffer).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateRegistryTest, ACudaBufferIsUnimplementedWithoutCuda) {
  std::vector<float> a(4);
  StateBuffer buffer = F32Buffer("layer0.weight", &a);
  buffer.device = Device::Cuda(0);
  StateRegistry registry;
  absl::Status status = registry.Register(buffer);
  if (status.ok()) GTEST_SKIP() << "trainguard was built with CUDA";
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("without CUDA"));
}

TEST(StateRegistryTest, LayoutHashDependsOnNamesSizesDtypesShapesAndDevicesButNotData) {
  std::vector<float> a(16), other(16);
  auto hash_of = [](StateBuffer buffer) {
    StateRegistry registry;
    EXPECT_TRUE(registry.Register(std::move(buffer)).ok());
    return registry.LayoutHash();
  };
  const StateBuffer base = F32Buffer("w", &a);
  const uint64_t h = hash_of(base);

  StateBuffer same_layout_other_memory = F32Buffer("w", &other);
  same_layout_other_memory.group = "optimizer";
  EXPECT_EQ(hash_of(same_layout_other_memory), h);

  StateBuffer renamed = base;
  renamed.name = "v";
  EXPECT_NE(hash_of(renamed), h);
  StateBuffer smaller = base;
  smaller.bytes = 32;
  smaller.shape = {8};
  EXPECT_NE(hash_of(smaller), h);
  StateBuffer retyped = base;
  retyped.dtype = DType::kI32;
  EXPECT_NE(hash_of(retyped), h);
  StateBuffer reshaped = base;
  reshaped.shape = {4, 4};
  EXPECT_NE(hash_of(reshaped), h);
  StateBuffer moved = base;
  moved.device = Device::Cuda(1);
  StateRegistry cuda_registry;
  // Which branch runs is fixed by the build, not by chance: with CUDA the buffer registers and the
  // device changes the hash; without, the buffer is refused
  // (ACudaBufferIsUnimplementedWithoutCuda).
  const absl::Status on_cuda = cuda_registry.Register(moved);
  if (on_cuda.ok()) {
    EXPECT_NE(cuda_registry.LayoutHash(), h);
  } else {
    EXPECT_EQ(on_cuda.code(), absl::StatusCode::kUnimplemented) << on_cuda;
  }
}

TEST(StateRegistryTest, BlobsAreSetReplacedAndReadBack) {
  StateRegistry registry;
  ASSERT_TRUE(registry.SetBlob("rng", std::string("\0\1\2", 3)).ok());
  ASSERT_TRUE(registry.SetBlob("loader", "epoch=1").ok());
  ASSERT_TRUE(registry.SetBlob("loader", "epoch=2").ok());
  EXPECT_EQ(*registry.GetBlob("rng"), std::string("\0\1\2", 3));
  EXPECT_EQ(*registry.GetBlob("loader"), "epoch=2");
  EXPECT_EQ(registry.blobs().size(), 2u);
  EXPECT_EQ(registry.GetBlob("scaler").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.SetBlob("", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateRegistryTest, DTypesHaveNamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
}

}  // namespace
}  // namespace trainguard
