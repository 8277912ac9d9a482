// Tokenizers read from a Hugging Face model directory: tokenizer.json (SentencePiece-style BPE with
// byte fallback, as Llama-2/Mistral ship it, and byte-level BPE with regex pre-tokenization, as
// Llama-3/Qwen ship it) and tokenizer.model through libsentencepiece when it was found at build time.
// BOS/EOS follow tokenizer_config.json (add_bos_token, add_eos_token) and the post-processor.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace marlinc::calib {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of text. With add_bos, the model's own special tokens are added the way its
  // configuration says (BOS first when the model uses one; EOS last when add_eos_token is set);
  // without it, the plain ids of the text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // Text of ids; special tokens (BOS, EOS, ...) are skipped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;  // -1 when the model has none
  virtual int32_t vocab_size() const = 0;
  // "tokenizer.json (sentencepiece-bpe)", "tokenizer.json (byte-level-bpe)", "tokenizer.model", ...
  virtual std::string description() const = 0;
};

// A tokenizer.json file (tokenizer_config.json beside it is read when present). Throws BadData naming
// the file and the unsupported or malformed part.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& tokenizer_json);
// The same from a JSON text (tests); config_json is the text of tokenizer_config.json or "".
std::unique_ptr<Tokenizer> tokenizer_from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                                    const std::string& label);
// A SentencePiece tokenizer.model. Throws BadUsage when marlinc was built without libsentencepiece.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& tokenizer_model);
bool have_sentencepiece();

// The model directory's tokenizer: tokenizer.json when present, else tokenizer.model. Throws BadData
// naming the directory when it has neither.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir);

}  // namespace marlinc::calib
