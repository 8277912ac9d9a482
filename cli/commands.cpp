#include "cli/commands.h"

namespace marlinc::cli {

static int g_status = 0;
int last_status() { return g_status; }
void set_status(int rc) { g_status = rc; }

void register_commands(CLI::App& app) {
  register_inspect(app);
  register_convert(app);
  register_verify(app);
  register_quantize(app);
  register_ppl(app);
}

}  // namespace marlinc::cli
