// DType's name and size (checkpoint.h): the element types every subsystem shares, so they sit in
// core.
#include <cstddef>
#include <string_view>

#include "trainguard/checkpoint.h"

namespace trainguard {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return "u8";
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return 1;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
  }
  return 0;
}

}  // namespace trainguard
