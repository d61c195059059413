// handlers.h: the XLA FFI handlers this package registers for the CPU platform (the names under
// which python/gdn/jax registers them are in bindings/module.cc).
#pragma once

#include "xla/ffi/api/c_api.h"

namespace gdn::bindings {

extern "C" {
XLA_FFI_Error* GdnForward(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnBackward(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnLayerForward(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnLayerBackward(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnStep(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnConvForward(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* GdnConvBackward(XLA_FFI_CallFrame* call_frame);
}

}  // namespace gdn::bindings
