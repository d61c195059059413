// commands.h: the subcommands of the gdn tool. Each parses its own options (argv[2..]),
// prints its own --help, and returns the process exit code; usage errors throw
// cli::UsageError, bad tensors gdn::InvalidArgument, unreadable files npy::NpyError.
#pragma once

namespace gdn::cli {

int forward_command(int argc, char** argv);
int backward_command(int argc, char** argv);
int bench_command(int argc, char** argv);
int bench_layer_command(int argc, char** argv);  // gdn bench --op layer
int bench_conv_command(int argc, char** argv);   // gdn bench --op conv
int bench_step_command(int argc, char** argv);   // gdn bench --op step
int bench_suite_command(int argc, char** argv);  // gdn bench --suite
int layer_forward_command(int argc, char** argv);
int plan_command(int argc, char** argv);
int layer_backward_command(int argc, char** argv);
int step_command(int argc, char** argv);

}  // namespace gdn::cli
