// step_plan.h: the decode plan of a serving step, and the step with a forced decode split, for
// `gdn plan --time` and the tests (which run every alternative; the split changes no bit).
#pragma once

#include "api/validate.h"
#include "cpu/plan.h"
#include "gdn/plan.h"
#include "gdn/step.h"

namespace gdn::detail {

// The plan of a validated step's decodes (a plan for one decode when it has none), with the
// choices in `force` forced; gdn::fused_gdn_step runs it with nothing forced.
Plan decode_plan(const StepOptions& options, const ValidatedStep& step,
                 const cpu::PlanForce& force);

// gdn::fused_gdn_step with the decode choices in `force` forced (gdn::InvalidArgument, before
// anything is written, when the batch cannot take them).
void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options, const cpu::PlanForce& force);

}  // namespace gdn::detail
