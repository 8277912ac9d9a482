// tokenizer.json reader (Hugging Face `tokenizers` format): BPE model, added tokens, the normalizers,
// pre-tokenizers, post-processors and decoders Llama/Mistral/Qwen/Gemma files use. Anything else is
// refused by name rather than silently tokenized differently, with one exception: added tokens are all
// matched on the raw text, so the `normalized` and `single_word` flags (which base models' special
// tokens leave false) are not applied.
#include <algorithm>
#include <array>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "quantizer/calib/bpe.h"
#include "quantizer/calib/pretokenize.h"
#include "quantizer/calib/tokenizer.h"
#include "quantizer/calib/unicode.h"

namespace marlinc::calib {

using nlohmann::json;

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 '▁', SentencePiece's space

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(ErrorKind::Io, p.string() + ": cannot open for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to themselves,
// the other 68 bytes to U+0100.. in byte order, so every byte string becomes a visible string.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> m{};
  char32_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    m[b] = printable ? static_cast<char32_t>(b) : extra++;
  }
  return m;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    out.append(s, i, j - i);
    out.append(to);
  }
  out.append(s, i, std::string::npos);
  s.swap(out);
}

// The token string of a tokenizer_config.json entry: "<s>" or {"content": "<s>", ...}.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

class JsonTokenizer final : public Tokenizer {
 public:
  JsonTokenizer(const json& tj, const json& cfg, const std::string& label) : label_(label) {
    parse_model(tj.at("model"));
    parse_added(tj);
    if (tj.contains("normalizer")) parse_normalizer(tj["normalizer"]);
    if (tj.contains("pre_tokenizer")) parse_pre_tokenizer(tj["pre_tokenizer"]);
    if (tj.contains("post_processor")) parse_post_processor(tj["post_processor"]);
    if (tj.contains("decoder")) parse_decoder(tj["decoder"]);
    apply_config(cfg);
    if (byte_level_) {
      auto m = bytes_to_unicode();
      for (int b = 0; b < 256; ++b) {
        byte_to_cp_[b].clear();
        utf8_append(byte_to_cp_[b], m[b]);
        cp_to_byte_[m[b]] = static_cast<uint8_t>(b);
      }
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> out;
    if (add_bos) out.insert(out.end(), prefix_.begin(), prefix_.end());
    bool first_segment = true;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t mbeg = text.size(), mend = text.size();
      int32_t mid = -1;
      find_added(text, pos, mbeg, mend, mid);
      if (mbeg > pos) encode_segment(text.substr(pos, mbeg - pos), first_segment, out);
      first_segment = false;
      if (mid < 0) break;
      out.push_back(mid);
      pos = mend;
    }
    if (add_bos) out.insert(out.end(), suffix_.begin(), suffix_.end());
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out, bytes;
    auto flush_bytes = [&] {
      // Byte-fallback pieces that do not form valid UTF-8 decode to one U+FFFD each, as HF's ByteFallback does.
      bool valid = true;
      for (size_t i = 0; i < bytes.size();) {
        Utf8Char c = utf8_decode(bytes, i);
        if (c.cp == 0xFFFD && c.len == 1 && bytes.compare(i, 3, "\xEF\xBF\xBD") != 0) valid = false;
        i += c.len;
      }
      if (valid) out += bytes;
      else for (size_t i = 0; i < bytes.size(); ++i) out += "\xEF\xBF\xBD";
      bytes.clear();
    };
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) continue;
      if (special_ids_.count(id)) continue;
      const std::string& p = pieces_[id];
      if (byte_level_) {
        for (size_t i = 0; i < p.size();) {
          Utf8Char c = utf8_decode(p, i);
          auto it = cp_to_byte_.find(c.cp);
          if (it != cp_to_byte_.end()) out.push_back(static_cast<char>(it->second));
          else out.append(p, i, c.len);
          i += c.len;
        }
        continue;
      }
      int b = byte_fallback_ ? byte_piece_value(p) : -1;
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        continue;
      }
      flush_bytes();
      std::string s = p;
      if (decode_metaspace_) replace_all(s, kMetaspace, " ");
      out += s;
    }
    flush_bytes();
    if (strip_leading_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::string description() const override {
    return std::string("tokenizer.json (") + (byte_level_ ? "byte-level-bpe" : "sentencepiece-bpe") + ", " +
           std::to_string(pieces_.size()) + " tokens, " + std::to_string(merges_.pairs.size()) + " merges)";
  }

 private:
  struct Added {
    std::string content;
    int32_t id;
    bool lstrip, rstrip;
  };
  enum class NormKind { Prepend, Replace, Nfc };
  struct NormStep {
    NormKind kind;
    std::string a, b;
  };
  enum class PreKind { Split, SplitString, ByteLevel, Metaspace };
  // A plain-string Split's behaviour: where each match goes (Hugging Face's SplitDelimiterBehavior).
  enum class Delim { Isolated, MergedWithPrevious, MergedWithNext, Removed };
  struct PreStep {
    PreKind kind = PreKind::Split;
    SplitFlavor flavor;        // Split, ByteLevel with use_regex
    std::string literal;       // SplitString
    Delim delim = Delim::Isolated;  // SplitString
    bool use_regex = false;    // ByteLevel
    bool prefix_space = false; // ByteLevel add_prefix_space
    std::string replacement;   // Metaspace
    std::string prepend_scheme;  // Metaspace: always | first | never
    bool split = false;        // Metaspace
  };

  // Token ids come from the file: integers in [0, kMaxTokenId], and the id -> token table they size must be
  // mostly used (real vocabularies are dense: Llama-3 128256 ids for 128256 tokens). One large id in a
  // small file would otherwise allocate gigabytes.
  static constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;
  static constexpr size_t kIdSlack = 1024;  // ids may run this far past 4 x the tokens (unused ids, padding)
  int32_t token_id(const json& v, const std::string& what) const {
    if (!v.is_number_integer()) bad_data(label_ + ": " + what + " is " + v.dump() + ", not an integer id");
    const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxTokenId) ? -1 : v.get<int64_t>();
    if (id < 0 || id > kMaxTokenId)
      bad_data(label_ + ": " + what + " = " + v.dump() + " is outside 0.." + std::to_string(kMaxTokenId));
    return static_cast<int32_t>(id);
  }
  // An id the encoder emits (post-processor specials): one of the vocabulary's, parsed before.
  int32_t vocab_id(const json& v, const std::string& what) const {
    const int32_t id = token_id(v, what);
    if (id >= static_cast<int32_t>(pieces_.size()))
      bad_data(label_ + ": " + what + " = " + std::to_string(id) + " is past the vocabulary (" +
               std::to_string(pieces_.size()) + " ids)");
    return id;
  }
  void check_dense(int64_t max_id, size_t tokens, const std::string& where) const {
    if (max_id >= 0 && static_cast<size_t>(max_id) + 1 > 4 * tokens + kIdSlack)
      bad_data(label_ + ": " + where + " reaches id " + std::to_string(max_id) + " with only " + std::to_string(tokens) +
               " tokens (ids must be mostly used: at most 4 x tokens + " + std::to_string(kIdSlack) + ")");
  }
  // Sequence steps (normalizers, pre-tokenizers, post-processors, decoders) nest at most this deep; real
  // files nest one level. Deeper nesting in a crafted file would recurse without bound.
  static constexpr int kMaxNesting = 8;
  void check_nesting(int depth, const char* what) const {
    if (depth > kMaxNesting)
      bad_data(label_ + ": " + what + " Sequence nested deeper than " + std::to_string(kMaxNesting) + " levels");
  }

  [[noreturn]] void unsupported(const std::string& what) const {
    bad_data(label_ + ": " + what + " is not supported (supported: BPE models with SentencePiece-style or "
             "byte-level pipelines as Llama, Mistral and Qwen ship them)");
  }

  void parse_model(const json& m) {
    if (m.value("type", std::string("BPE")) != "BPE") unsupported("model type '" + m.value("type", std::string()) + "'");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && m[k] != "") unsupported(std::string("BPE option ") + k);
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      unsupported("BPE dropout");
    byte_fallback_ = m.value("byte_fallback", false);
    fuse_unk_ = m.value("fuse_unk", false);
    ignore_merges_ = m.value("ignore_merges", false);
    const json& vocab = m.at("vocab");
    if (!vocab.is_object()) bad_data(label_ + ": model.vocab must be an object of token -> id");
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = token_id(it.value(), "model.vocab: the id of token '" + it.key() + "'");
      vocab_[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    check_dense(max_id, vocab.size(), "model.vocab");
    pieces_.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [tok, id] : vocab_) pieces_[id] = tok;
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab_.find(m["unk_token"].get<std::string>());
      if (it == vocab_.end()) bad_data(label_ + ": model.unk_token '" + m["unk_token"].get<std::string>() + "' is not in the vocab");
      unk_ = it->second;
    }
    if (byte_fallback_) {
      static const char* hex = "0123456789ABCDEF";
      for (int b = 0; b < 256; ++b) {
        std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
        auto it = vocab_.find(name);
        byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
      }
    }
    const json& merges = m.at("merges");
    if (!merges.is_array()) bad_data(label_ + ": model.merges must be an array");
    int32_t rank = 0;
    for (const json& e : merges) {
      std::string a, b;
      if (e.is_string()) {
        // Older files write "left right"; tokens cannot contain a space in that form.
        const std::string s = e.get<std::string>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          bad_data(label_ + ": merge #" + std::to_string(rank) + " '" + s + "' is not two tokens separated by one space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        bad_data(label_ + ": merge #" + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end())
        bad_data(label_ + ": merge #" + std::to_string(rank) + " ('" + a + "', '" + b + "') uses a token missing from the vocab");
      merges_.pairs.emplace(MergeTable::key(ia->second, ib->second), MergeTable::Merge{rank, ic->second});
      ++rank;
    }
  }

  void parse_added(const json& tj) {
    if (!tj.contains("added_tokens") || tj["added_tokens"].is_null()) return;
    const json& list = tj["added_tokens"];
    int64_t max_id = -1;
    for (const json& t : list) max_id = std::max<int64_t>(max_id, token_id(t.at("id"), "added token id"));
    check_dense(max_id, vocab_.size() + list.size(), "added_tokens");
    for (const json& t : list) {
      Added a{t.at("content").get<std::string>(), token_id(t.at("id"), "added token id"), t.value("lstrip", false),
              t.value("rstrip", false)};
      if (a.id >= static_cast<int32_t>(pieces_.size())) pieces_.resize(static_cast<size_t>(a.id) + 1);
      if (pieces_[a.id].empty()) pieces_[a.id] = a.content;
      vocab_.emplace(a.content, a.id);
      if (t.value("special", false)) special_ids_.insert(a.id);
      if (!a.content.empty()) added_.push_back(std::move(a));
    }
    // Longest first, so that at one position the longest added token wins.
    std::stable_sort(added_.begin(), added_.end(),
                     [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
    for (size_t i = 0; i < added_.size(); ++i)
      added_by_first_[static_cast<uint8_t>(added_[i].content[0])].push_back(static_cast<uint32_t>(i));
  }

  void parse_normalizer(const json& n, int depth = 0) {
    if (n.is_null()) return;
    check_nesting(depth, "normalizer");
    const std::string type = n.value("type", std::string());
    if (type == "Sequence") {
      for (const json& s : n.at("normalizers")) parse_normalizer(s, depth + 1);
    } else if (type == "Prepend") {
      norm_.push_back({NormKind::Prepend, n.at("prepend").get<std::string>(), {}});
    } else if (type == "Replace") {
      const json& p = n.at("pattern");
      if (!p.contains("String")) unsupported("Replace normalizer with a regex pattern");
      norm_.push_back({NormKind::Replace, p["String"].get<std::string>(), n.at("content").get<std::string>()});
    } else if (type == "NFC") {
      norm_.push_back({NormKind::Nfc, {}, {}});
    } else {
      unsupported("normalizer '" + type + "'");
    }
  }

  void parse_pre_tokenizer(const json& p, int depth = 0) {
    if (p.is_null()) return;
    check_nesting(depth, "pre_tokenizer");
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const json& s : p.at("pretokenizers")) parse_pre_tokenizer(s, depth + 1);
    } else if (type == "Split") {
      const json& pat = p.at("pattern");
      if (pat.is_object() && pat.contains("String")) {
        // Gemma's tokenizer.json (transformers 5): Split on " " merged with the previous piece, after a
        // normalizer that already replaced every space.
        if (!pat["String"].is_string() || pat["String"].get<std::string>().empty())
          unsupported("Split pre-tokenizer pattern String that is not a non-empty string");
        if (p.value("invert", false)) unsupported("Split pre-tokenizer with invert on a plain-string pattern");
        const std::string behavior = p.value("behavior", std::string("Isolated"));
        PreStep st;
        st.kind = PreKind::SplitString;
        st.literal = pat["String"].get<std::string>();
        if (behavior == "Isolated") st.delim = Delim::Isolated;
        else if (behavior == "MergedWithPrevious") st.delim = Delim::MergedWithPrevious;
        else if (behavior == "MergedWithNext") st.delim = Delim::MergedWithNext;
        else if (behavior == "Removed") st.delim = Delim::Removed;
        else unsupported("Split pre-tokenizer behaviour '" + behavior.substr(0, 32) + "' on a plain-string pattern");
        pre_.push_back(st);
        return;
      }
      if (pat.contains("Regex") && !pat["Regex"].is_string()) unsupported("Split pre-tokenizer pattern Regex that is not a string");
      std::string regex = pat.contains("Regex") ? pat["Regex"].get<std::string>() : std::string();
      auto fl = flavor_from_pattern(regex);
      if (!fl) unsupported("Split pre-tokenizer pattern '" + regex + "' (known: the GPT-2, Llama-3 and Qwen2 patterns)");
      if (p.value("behavior", std::string("Isolated")) != "Isolated" || p.value("invert", false))
        unsupported("Split pre-tokenizer behaviour other than Isolated");
      PreStep st;
      st.kind = PreKind::Split;
      st.flavor = *fl;
      pre_.push_back(st);
    } else if (type == "ByteLevel") {
      PreStep s;
      s.kind = PreKind::ByteLevel;
      s.flavor = gpt2_flavor();
      s.use_regex = p.value("use_regex", true);
      s.prefix_space = p.value("add_prefix_space", false);
      pre_.push_back(s);
      byte_level_ = true;
    } else if (type == "Metaspace") {
      PreStep s;
      s.kind = PreKind::Metaspace;
      s.replacement = p.value("replacement", std::string(kMetaspace));
      s.prepend_scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
      s.split = p.value("split", true);
      pre_.push_back(s);
    } else {
      unsupported("pre-tokenizer '" + type + "'");
    }
  }

  // Ids of a template's SpecialToken entry, through the template's own special_tokens table.
  std::vector<int32_t> special_ids(const json& tp, const std::string& name) const {
    if (tp.contains("special_tokens") && tp["special_tokens"].contains(name)) {
      std::vector<int32_t> ids;
      for (const json& v : tp["special_tokens"][name].at("ids")) ids.push_back(vocab_id(v, "post_processor special token '" + name + "'"));
      return ids;
    }
    auto it = vocab_.find(name);
    if (it == vocab_.end()) bad_data(label_ + ": post_processor names special token '" + name + "' that is not in the vocab");
    return {it->second};
  }

  void parse_post_processor(const json& p, int depth = 0) {
    if (p.is_null()) return;
    check_nesting(depth, "post_processor");
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const json& s : p.at("processors")) parse_post_processor(s, depth + 1);
    } else if (type == "ByteLevel") {
      // Only adjusts offsets; ids are unchanged.
    } else if (type == "TemplateProcessing") {
      prefix_.clear();
      suffix_.clear();
      bool seen_a = false;
      for (const json& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_a = true;
        } else if (item.contains("SpecialToken")) {
          auto ids = special_ids(p, item["SpecialToken"].at("id").get<std::string>());
          auto& dst = seen_a ? suffix_ : prefix_;
          dst.insert(dst.end(), ids.begin(), ids.end());
        }
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      prefix_ = {vocab_id(p.at("cls").at(1), "post_processor cls id")};
      suffix_ = {vocab_id(p.at("sep").at(1), "post_processor sep id")};
    } else {
      unsupported("post_processor '" + type + "'");
    }
  }

  void parse_decoder(const json& d, int depth = 0) {
    if (d.is_null()) return;
    check_nesting(depth, "decoder");
    const std::string type = d.value("type", std::string());
    if (type == "Sequence") {
      for (const json& s : d.at("decoders")) parse_decoder(s, depth + 1);
    } else if (type == "Replace") {
      const json& p = d.at("pattern");
      if (p.contains("String") && p["String"] == std::string(kMetaspace)) decode_metaspace_ = true;
    } else if (type == "Strip") {
      strip_leading_space_ = d.value("start", 0) > 0;
    } else if (type == "Metaspace") {
      decode_metaspace_ = true;
      strip_leading_space_ = d.value("prepend_scheme", std::string("always")) != "never";
    }
    // ByteFallback, Fuse and ByteLevel are implied by the model and pre-tokenizer.
  }

  int32_t lookup(const std::string& tok) const {
    auto it = vocab_.find(tok);
    return it == vocab_.end() ? -1 : it->second;
  }

  // tokenizer_config.json decides BOS/EOS when it says so explicitly; otherwise the post-processor does.
  void apply_config(const json& cfg) {
    auto id_of = [&](const char* key) -> int32_t {
      if (!cfg.is_object() || !cfg.contains(key)) return -1;
      std::string c = token_content(cfg[key]);
      return c.empty() ? -1 : lookup(c);
    };
    bos_ = id_of("bos_token");
    eos_ = id_of("eos_token");
    if (bos_ < 0 && !prefix_.empty()) bos_ = prefix_.front();
    if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      bool want = cfg["add_bos_token"].get<bool>();
      if (want && bos_ < 0) bad_data(label_ + ": tokenizer_config.json sets add_bos_token but names no bos_token in the vocab");
      std::erase(prefix_, bos_);
      if (want) prefix_.insert(prefix_.begin(), bos_);
    }
    if (cfg.is_object() && cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
      bool want = cfg["add_eos_token"].get<bool>();
      if (want && eos_ < 0) bad_data(label_ + ": tokenizer_config.json sets add_eos_token but names no eos_token in the vocab");
      std::erase(suffix_, eos_);
      if (want) suffix_.push_back(eos_);
    }
  }

  // Earliest added token at or after pos (longest at that position), with lstrip/rstrip whitespace
  // absorbed. A linear scan keyed by first byte: files have at most a few hundred added tokens.
  void find_added(std::string_view text, size_t pos, size_t& mbeg, size_t& mend, int32_t& mid) const {
    if (added_.empty()) return;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& cands = added_by_first_[static_cast<uint8_t>(text[i])];
      for (uint32_t k : cands) {
        const Added& a = added_[k];
        if (text.compare(i, a.content.size(), a.content) != 0) continue;
        size_t b = i, e = i + a.content.size();
        if (a.lstrip) b = strip_back(text, pos, b);
        if (a.rstrip) e = strip_forward(text, e);
        mbeg = b;
        mend = e;
        mid = a.id;
        return;
      }
    }
  }
  // lstrip / rstrip take Unicode whitespace (Rust's char::is_whitespace, as Hugging Face tokenizers
  // does: U+00A0 and U+3000 too), a whole character at a time.
  static size_t strip_forward(std::string_view text, size_t e) {
    while (e < text.size()) {
      const Utf8Char c = utf8_decode(text, e);
      if (!is_whitespace(c.cp) || (c.cp == 0xFFFD && c.len == 1)) break;
      e += c.len;
    }
    return e;
  }
  static size_t strip_back(std::string_view text, size_t lo, size_t b) {
    while (b > lo) {
      size_t start = b - 1;  // the start of the character that ends at b
      while (start > lo && b - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      const Utf8Char c = utf8_decode(text, start);
      if (start + c.len != b || !is_whitespace(c.cp)) break;
      b = start;
    }
    return b;
  }

  std::string normalize(std::string_view seg) const {
    std::string s(seg);
    for (const NormStep& st : norm_) {
      switch (st.kind) {
        case NormKind::Prepend:
          if (!s.empty()) s.insert(0, st.a);
          break;
        case NormKind::Replace: replace_all(s, st.a, st.b); break;
        case NormKind::Nfc: s = nfc(s); break;
      }
    }
    return s;
  }

  // Pieces of p around each occurrence of st.literal, the occurrence placed by st.delim (empty pieces dropped).
  static void split_literal(const std::string& p, const PreStep& st, std::vector<std::string>& next) {
    const std::string& lit = st.literal;
    std::string carry;  // MergedWithNext: the match that starts the next piece
    size_t start = 0;
    auto emit = [&](std::string piece) {
      if (!piece.empty()) next.push_back(std::move(piece));
    };
    for (size_t j = p.find(lit); j != std::string::npos; j = p.find(lit, start)) {
      std::string before = carry + p.substr(start, j - start);
      carry.clear();
      switch (st.delim) {
        case Delim::Isolated: emit(std::move(before)); emit(lit); break;
        case Delim::MergedWithPrevious: emit(before + lit); break;
        case Delim::MergedWithNext: emit(std::move(before)); carry = lit; break;
        case Delim::Removed: emit(std::move(before)); break;
      }
      start = j + lit.size();
    }
    emit(carry + p.substr(start));
  }

  void encode_segment(std::string_view seg, bool first_segment, std::vector<int32_t>& out) const {
    std::string norm = normalize(seg);
    if (norm.empty()) return;
    std::vector<std::string> pieces{std::move(norm)};
    for (const PreStep& st : pre_) {
      std::vector<std::string> next;
      for (std::string& p : pieces) {
        switch (st.kind) {
          case PreKind::Split:
            for (std::string_view v : regex_split(p, st.flavor)) next.emplace_back(v);
            break;
          case PreKind::SplitString: split_literal(p, st, next); break;
          case PreKind::ByteLevel: {
            if (st.prefix_space && !p.empty() && p[0] != ' ') p.insert(0, " ");
            if (st.use_regex) for (std::string_view v : regex_split(p, st.flavor)) next.emplace_back(v);
            else next.push_back(std::move(p));
            break;
          }
          case PreKind::Metaspace: {
            replace_all(p, " ", st.replacement);
            bool prepend = st.prepend_scheme == "always" || (st.prepend_scheme == "first" && first_segment);
            if (prepend && p.compare(0, st.replacement.size(), st.replacement) != 0) p.insert(0, st.replacement);
            if (!st.split) { next.push_back(std::move(p)); break; }
            // Each word starts at a replacement character (behaviour MergedWithNext).
            size_t start = 0;
            for (size_t j = p.find(st.replacement, 1); j != std::string::npos; j = p.find(st.replacement, j + 1)) {
              next.push_back(p.substr(start, j - start));
              start = j;
            }
            next.push_back(p.substr(start));
            break;
          }
        }
      }
      pieces.swap(next);
    }
    for (const std::string& p : pieces) {
      if (p.empty()) continue;
      if (byte_level_) {
        std::string mapped;
        for (unsigned char b : p) mapped += byte_to_cp_[b];
        encode_word(mapped, out);
      } else {
        encode_word(p, out);
      }
    }
  }

  // One pre-tokenized word: its characters as initial symbols (byte fallback / unk for characters
  // missing from the vocab), then the merges.
  void encode_word(const std::string& w, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
      int32_t id = lookup(w);
      if (id >= 0) { out.push_back(id); return; }
    }
    std::vector<int32_t> syms;
    syms.reserve(w.size());
    bool prev_unk = false;
    for (size_t i = 0; i < w.size();) {
      size_t len = utf8_char_len(w, i);
      auto it = vocab_.find(std::string_view(w).substr(i, len));
      if (it != vocab_.end()) {
        syms.push_back(it->second);
        prev_unk = false;
      } else {
        bool done = false;
        if (byte_fallback_) {
          bool all = true;
          for (size_t j = 0; j < len; ++j) all &= byte_ids_[static_cast<uint8_t>(w[i + j])] >= 0;
          if (all) {
            for (size_t j = 0; j < len; ++j) syms.push_back(byte_ids_[static_cast<uint8_t>(w[i + j])]);
            done = true;
            prev_unk = false;
          }
        }
        if (!done) {
          if (unk_ < 0) bad_data(label_ + ": character at byte " + std::to_string(i) + " of a word is not in the vocab and the model has no unk_token");
          if (!(fuse_unk_ && prev_unk)) syms.push_back(unk_);
          prev_unk = true;
        }
      }
      i += len;
    }
    bpe_merge(syms, merges_);
    out.insert(out.end(), syms.begin(), syms.end());
  }

  int byte_piece_value(const std::string& p) const {
    if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
    auto hv = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    int h = hv(p[3]), l = hv(p[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }

  std::string label_;
  // Heterogeneous lookup: characters of a word are looked up as string_views, without allocating.
  struct SvHash {
    using is_transparent = void;
    size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
  };
  std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>> vocab_;
  std::vector<std::string> pieces_;  // [vocab] id -> token string
  MergeTable merges_;
  std::vector<Added> added_;
  std::array<std::vector<uint32_t>, 256> added_by_first_;
  std::unordered_set<int32_t> special_ids_;
  std::vector<NormStep> norm_;
  std::vector<PreStep> pre_;
  std::vector<int32_t> prefix_, suffix_;
  std::array<int32_t, 256> byte_ids_{};
  std::array<std::string, 256> byte_to_cp_;
  std::unordered_map<char32_t, uint8_t> cp_to_byte_;
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, byte_level_ = false;
  bool decode_metaspace_ = false, strip_leading_space_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                                    const std::string& label) {
  json tj, cfg = json::object();
  try {
    tj = json::parse(tokenizer_json);
    if (!config_json.empty()) cfg = json::parse(config_json);
  } catch (const json::exception& e) {
    bad_data(label + ": not valid JSON: " + e.what());
  }
  try {
    return std::make_unique<JsonTokenizer>(tj, cfg, label);
  } catch (const json::exception& e) {
    bad_data(label + ": malformed tokenizer: " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& path) {
  std::string cfg;
  auto cfg_path = path.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) cfg = read_text(cfg_path);
  return tokenizer_from_json_text(read_text(path), cfg, path.string());
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "tokenizer.json")) return load_tokenizer_json(dir / "tokenizer.json");
  if (std::filesystem::exists(dir / "tokenizer.model")) return load_sentencepiece(dir / "tokenizer.model");
  bad_data(dir.string() + ": no tokenizer.json or tokenizer.model in the model directory");
}

}  // namespace marlinc::calib
