// gdn/gdn.h: the whole public API of the gdn library.
#pragma once

#include "gdn/backward.h"   // IWYU pragma: export
#include "gdn/conv.h"       // IWYU pragma: export
#include "gdn/error.h"      // IWYU pragma: export
#include "gdn/forward.h"    // IWYU pragma: export
#include "gdn/layer.h"      // IWYU pragma: export
#include "gdn/plan.h"       // IWYU pragma: export
#include "gdn/reference.h"  // IWYU pragma: export
#include "gdn/runtime.h"    // IWYU pragma: export
#include "gdn/step.h"       // IWYU pragma: export
#include "gdn/tensor.h"     // IWYU pragma: export
#include "gdn/threads.h"    // IWYU pragma: export
