// The subcommands of the `qinfer` binary.
#pragma once

namespace qinfer {

int cmd_synth(int argc, char ** argv);
int cmd_run(int argc, char ** argv);
int cmd_logits(int argc, char ** argv);
int cmd_info(int argc, char ** argv);
int cmd_bench(int argc, char ** argv);

}  // namespace qinfer
