// The umbrella header of trainguard: include this one header to use the SDK.
//
// It also defines the short namespace alias `sdk` for `trainguard`, as used in the documentation:
//     sdk::StepResult r = sdk::guard(*rt, step, [&](sdk::Step& s) { ... });
#ifndef TRAINGUARD_SDK_H_
#define TRAINGUARD_SDK_H_

#include "trainguard/checkpoint.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/env.h"
#include "trainguard/errors.h"
#include "trainguard/events.h"
#include "trainguard/guard.h"
#include "trainguard/health.h"
#include "trainguard/membership.h"
#include "trainguard/options.h"
#include "trainguard/runtime.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"
#include "trainguard/version.h"
#include "trainguard/watchdog.h"

namespace sdk = ::trainguard;

#endif  // TRAINGUARD_SDK_H_
