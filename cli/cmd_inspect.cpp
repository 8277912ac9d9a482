#include "cli/commands.h"

namespace marlinc::cli {

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "List tensors, detected format and Marlin compatibility");
  static std::string path;
  cmd->add_option("PATH", path, "safetensors file or checkpoint directory")->required();
  cmd->callback([] { set_status(0); });
}

}  // namespace marlinc::cli
