// libFuzzer target for the resume job's readers (quantizer/calib/job_file.h), whose bytes come back
// from disk after a crash, a full disk or a hand edit. Whatever the bytes, the block decoder either
// returns layers that validate or throws marlinc::Error(BadData), and GptqJob::open either accepts
// job.json or throws BadData / BadUsage. Any other exception, crash, leak or UB report is a bug.
// The first input byte picks the target: a block file as given (header and checksum checks), a block
// body wrapped in a valid header and SHA-256 trailer (so the fuzzer reaches the field parser behind
// the checksum), or job.json.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/error.h"
#include "checkpoint/sha256.h"
#include "quantizer/calib/job_file.h"

namespace {

const std::string kFingerprint(64, 'a');

void expect(const marlinc::Error& e, bool usage_ok) {
  if (e.kind() == marlinc::ErrorKind::BadData) return;
  if (usage_ok && e.kind() == marlinc::ErrorKind::BadUsage) return;
  std::abort();
}

void decode(const std::string& bytes) {
  try {
    for (const auto& l : marlinc::calib::decode_block(bytes, kFingerprint, 3, "fuzz")) l.q.validate();
  } catch (const marlinc::Error& e) {
    expect(e, false);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      decode(body);
      break;
    case 1: {
      std::string file = "MLCJOBB1" + kFingerprint;
      const uint64_t block = 3;
      file.append(reinterpret_cast<const char*>(&block), sizeof block);
      file += body;
      marlinc::Sha256 h;
      h.update(file);
      const auto digest = h.digest();
      file.append(reinterpret_cast<const char*>(digest.data()), digest.size());
      decode(file);
      break;
    }
    default: {
      static const std::filesystem::path dir =
          std::filesystem::temp_directory_path() / ("marlinc-fuzz-job-" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      std::ofstream(dir / "job.json", std::ios::binary | std::ios::trunc) << body;
      marlinc::calib::JobInputs now;
      now.json = {{"model", {{"config", "x"}}}, {"options", {{"group", 128}}}};
      try {
        marlinc::calib::GptqJob::open(dir, now, 4);
      } catch (const marlinc::Error& e) {
        expect(e, true);
      }
      break;
    }
  }
  return 0;
}
