// `trainguard ckpt`: inspects the checkpoint shards a Persister wrote
// (sdk/checkpoint/persister.h).
//
//   trainguard ckpt list DIR [--json]                  committed steps: ranks and sizes
//   trainguard ckpt inspect DIR [--step S] [--json]    one step's shards (default: the newest)
//   trainguard ckpt verify DIR [--step S] [--json]     every chunk of every committed shard
//   trainguard ckpt export DIR [--step S] [--rank R] --out FILE
//                                                      one rank's shard as a safetensors file
//                                                      (tools/safetensors_export.h)
//
// Exit codes: 0 success (verify: every shard intact); 1 a shard is corrupt or missing, or DIR
// cannot be read (each corrupt chunk is named: file, payload offset, rank, step; export: also no
// such step or rank, or FILE cannot be written); 2 bad usage (the usage on stderr). --help or -h
// prints the usage of the verb named, or of all, and exits 0.
#ifndef TRAINGUARD_TOOLS_CKPT_COMMAND_H_
#define TRAINGUARD_TOOLS_CKPT_COMMAND_H_

#include <string>
#include <vector>

namespace trainguard::tools {

// `args` are the words after "ckpt". Prints to stdout, errors and progress to stderr.
int RunCkptCommand(const std::vector<std::string>& args);
std::string CkptUsage();

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_CKPT_COMMAND_H_
