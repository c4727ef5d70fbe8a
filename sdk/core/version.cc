#include "trainguard/version.h"

namespace trainguard {

const char* VersionString() { return TRAINGUARD_VERSION_STRING; }

}  // namespace trainguard
