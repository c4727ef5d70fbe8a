// HumanBytes: a byte count as a person reads it, for error messages and reports (private to sdk/;
// any subsystem and the tools may include it, sdk/core being the bottom layer). Thread-safe.
#ifndef TRAINGUARD_SDK_CORE_HUMAN_BYTES_H_
#define TRAINGUARD_SDK_CORE_HUMAN_BYTES_H_

#include <cstdint>
#include <string>

namespace trainguard {

// Binary units with two decimals from 1 KiB up ("16.01 KiB", "64.00 MiB", "1.50 GiB",
// "1024.00 TiB"), whole bytes below ("512 B").
std::string HumanBytes(uint64_t bytes);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_HUMAN_BYTES_H_
