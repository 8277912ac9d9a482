// Each subcommand lives in its own cli/cmd_*.cpp and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace marlinc::cli {

void register_commands(CLI::App& app);
// Exit status set by the subcommand that ran (0 = success; non-zero e.g. when verify fails).
int last_status();
void set_status(int rc);

// Registration hooks, one per cmd_*.cpp (declared here so register_commands can call them).
void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);
void register_verify(CLI::App& app);
void register_quantize(CLI::App& app);
void register_ppl(CLI::App& app);

}  // namespace marlinc::cli
