// direct.h: the extension's calls on caller-owned memory (direct.cc), for gdn.torch.
#pragma once

#include <nanobind/nanobind.h>

namespace gdn::bindings {

// Adds core_forward, core_backward, conv_forward, conv_backward, conv_update and step to the
// module.
void define_direct_calls(nanobind::module_& m);

}  // namespace gdn::bindings
