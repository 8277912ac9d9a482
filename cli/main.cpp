// marlinc command-line front end: parse, call the libraries, print, map errors to exit codes.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <signal.h>  // sigaction

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "checkpoint/error.h"
#include "checkpoint/output_lock.h"
#include "checkpoint/writer.h"
#include "cli/commands.h"

#ifndef MARLINC_HAVE_CUDA
#define MARLINC_CUDA_STATE "off"
#else
#define MARLINC_CUDA_STATE "on"
#endif

namespace {

// Ctrl-C, kill, a closed terminal or a closed pipe (`marlinc ... | head`): no half-written `<out>.tmp-*`
// directory and no `<out>.marlinc-lock` file stays behind. The default action then ends the process with the signal's status, as a
// shell expects.
void on_fatal_signal(int sig) {
  marlinc::remove_live_temp_outputs();
  marlinc::remove_live_output_locks();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// A signal ignored when marlinc starts stays ignored: `nohup` ignores SIGHUP, and a shell ignores SIGINT
// for its background jobs, so that closing the terminal or a Ctrl-C does not stop those runs.
void install_signal_cleanup() {
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  install_signal_cleanup();
  // Eigen's own multithreading picks its GEMM blocking from the thread count, which changes float
  // summation order: outputs would then depend on OMP_NUM_THREADS. The libraries parallelise over
  // independent work with OpenMP instead, so Eigen runs single-threaded and a given input and set of
  // options gives byte-identical files on any machine.
  Eigen::setNbThreads(1);
  CLI::App app{"marlinc: quantize LLM checkpoints with GPTQ and pack them for the Marlin INT4 kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("marlinc ") + MARLINC_VERSION + " (CUDA " + MARLINC_CUDA_STATE +
                           ", architectures: " + (MARLINC_CUDA_ARCHS[0] ? MARLINC_CUDA_ARCHS : "none") + ")");
  marlinc::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const marlinc::Error& e) {
    std::cerr << "marlinc: error: " << e.what() << "\n";
    return marlinc::exit_code(e.kind());
  } catch (const std::filesystem::filesystem_error& e) {  // a path the system refuses (loops, permissions)
    std::cerr << "marlinc: error: " << e.what() << "\n";
    return marlinc::exit_code(marlinc::ErrorKind::Io);
  } catch (const std::exception& e) {
    std::cerr << "marlinc: internal error: " << e.what() << "\n";
    return 3;
  }
  return marlinc::cli::last_status();
}
