// tokenizer.model through libsentencepiece (Debian's libsentencepiece-dev), when CMake found it.
#include "checkpoint/error.h"
#include "quantizer/calib/tokenizer.h"

#ifdef MARLINC_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>

#include <fstream>
#include <nlohmann/json.hpp>
#endif

namespace marlinc::calib {

#ifdef MARLINC_HAVE_SENTENCEPIECE
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& path) : path_(path) {
    auto st = sp_.Load(path.string());
    if (!st.ok()) bad_data(path.string() + ": libsentencepiece cannot load the model: " + st.ToString());
    add_bos_ = sp_.bos_id() >= 0;
    // tokenizer_config.json beside the model overrides SentencePiece's defaults (BOS on, EOS off).
    auto cfg_path = path.parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      std::ifstream f(cfg_path);
      nlohmann::json cfg = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (cfg.is_object()) {
        if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos_ = cfg["add_bos_token"].get<bool>();
        if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) add_eos_ = cfg["add_eos_token"].get<bool>();
      }
    }
  }
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(std::string(text), &ids);
    if (!st.ok()) bad_data(path_.string() + ": libsentencepiece cannot encode the text: " + st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (add_bos && add_bos_ && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_bos && add_eos_ && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v;
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize() && !sp_.IsControl(id)) v.push_back(id);
    std::string out;
    auto st = sp_.Decode(v, &out);
    if (!st.ok()) bad_data(path_.string() + ": libsentencepiece cannot decode: " + st.ToString());
    return out;
  }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::string description() const override {
    return "tokenizer.model (sentencepiece, " + std::to_string(sp_.GetPieceSize()) + " pieces)";
  }

 private:
  std::filesystem::path path_;
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) fail(ErrorKind::Io, path.string() + ": no such file");
  return std::make_unique<SentencePieceTokenizer>(path);
}
bool have_sentencepiece() { return true; }

#else

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& path) {
  bad_usage(path.string() + ": reading tokenizer.model needs libsentencepiece, and this marlinc was built without "
            "it (install libsentencepiece-dev and rebuild), or put a tokenizer.json beside the model");
}
bool have_sentencepiece() { return false; }

#endif

}  // namespace marlinc::calib
