// The source of trainguard_test_pch, the target whose precompiled header every test reuses
// (tests/CMakeLists.txt). It holds no test.
#include "gtest/gtest.h"
