// libFuzzer target for tokenizer.json and tokenizer_config.json as marlinc reads them from a model
// directory (the input: tokenizer.json, then after the first NUL byte tokenizer_config.json). Any bytes
// must either load into a tokenizer whose encode and decode of a fixed text and of the input's tail run
// to completion with every id inside the vocabulary, or throw marlinc::Error(BadData). Any other
// exception (nlohmann's type errors among them), crash, leak or UB report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/error.h"
#include "quantizer/calib/tokenizer.h"

namespace {

void run(const marlinc::calib::Tokenizer& tok, std::string_view text) {
  for (bool add_bos : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, add_bos);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    (void)tok.decode(ids);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view json = all.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);
  try {
    const auto tok = marlinc::calib::tokenizer_from_json_text(json, config, "fuzz/tokenizer.json");
    run(*tok, "Hello world's 12345  \n\n foo!! na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\xff");
    run(*tok, config.substr(0, 256));  // arbitrary bytes, invalid UTF-8 included
  } catch (const marlinc::Error& e) {
    if (e.kind() != marlinc::ErrorKind::BadData) std::abort();
  }
  return 0;
}
