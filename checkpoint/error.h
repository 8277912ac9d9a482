// The one exception type of marlinc's libraries. Libraries never print or exit: they throw this,
// naming what was wrong (file, tensor, shape, option) and the rule it broke; the CLI maps the kind
// to an exit code.
#pragma once
#include <stdexcept>
#include <string>

namespace marlinc {

enum class ErrorKind {
  BadData = 1,   // input bytes or values break a format rule (exit 1)
  BadUsage = 2,  // options or arguments the user can fix (exit 2)
  Io = 3,        // the OS refused a read/write (exit 1)
  Internal = 4,  // a bug or a failed device call (exit 3)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& what) { throw Error(kind, what); }
[[noreturn]] inline void bad_data(const std::string& what) { throw Error(ErrorKind::BadData, what); }
[[noreturn]] inline void bad_usage(const std::string& what) { throw Error(ErrorKind::BadUsage, what); }

inline int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::BadUsage: return 2;
    case ErrorKind::Internal: return 3;
    default: return 1;
  }
}

}  // namespace marlinc
