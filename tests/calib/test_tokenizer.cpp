// Tokenizers against real files (Llama-2 golden ids, stories260K calibration ids) and a small
// byte-level BPE tokenizer.json built here.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "quantizer/calib/bpe.h"
#include "quantizer/calib/calib_data.h"
#include "quantizer/calib/pretokenize.h"
#include "quantizer/calib/tokenizer.h"
#include "quantizer/calib/unicode.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::calib;
using nlohmann::json;

namespace {

constexpr size_t kCalibTinyDocs = 163;       // stories260K README §5
constexpr size_t kCalibTinyTokens = 66217;   // stories260K README §5
constexpr size_t kCalibTinyMinLen = 2, kCalibTinyMaxLen = 512;
constexpr size_t kLlama2GoldenRows = 38;     // llama2-tokenizer README

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct GoldenRow {
  std::string text;
  std::vector<int32_t> ids;
};
std::vector<GoldenRow> llama2_golden() {
  std::vector<GoldenRow> rows;
  std::ifstream f(test::shared_dir() / "data" / "llama2-tokenizer" / "golden.jsonl");
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    json j = json::parse(line);
    rows.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int32_t>>()});
  }
  return rows;
}

void check_golden(const Tokenizer& tok) {
  auto rows = llama2_golden();
  REQUIRE(rows.size() == kLlama2GoldenRows);
  size_t same = 0;
  for (const auto& r : rows) {
    auto ids = tok.encode(r.text, true);
    if (ids == r.ids) ++same;
    else UNSCOPED_INFO("mismatch: " << r.text);
    CHECK(ids == r.ids);
  }
  CHECK(same == rows.size());
}

}  // namespace

TEST_CASE("Llama-2 tokenizer.json gives the golden SentencePiece ids", "[tokenizer]") {
  MARLINC_REQUIRE_SHARED();
  auto tok = load_tokenizer_json(test::shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.json");
  CHECK(tok->vocab_size() == 32000);
  CHECK(tok->bos_id() == 1);
  check_golden(*tok);
  // Without special tokens the same ids minus BOS.
  CHECK(tok->encode("Hello world", false) == std::vector<int32_t>{15043, 3186});
  // decode inverts encode on every golden string (the leading '▁' is stripped, byte pieces fuse).
  for (const auto& r : llama2_golden()) CHECK(tok->decode(r.ids) == r.text);
}

TEST_CASE("Llama-2 tokenizer.model through libsentencepiece gives the golden ids", "[tokenizer]") {
  MARLINC_REQUIRE_SHARED();
  const auto path = test::shared_dir() / "data" / "llama2-tokenizer" / "tokenizer.model";
  if (!have_sentencepiece()) {
    REQUIRE_THROWS_AS(load_sentencepiece(path), Error);
    WARN("skipped: built without libsentencepiece");
    return;
  }
  auto tok = load_sentencepiece(path);
  CHECK(tok->vocab_size() == 32000);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  check_golden(*tok);
  for (const auto& r : llama2_golden()) CHECK(tok->decode(r.ids) == r.text);
}

TEST_CASE("stories260K tokenizer.json reproduces calib-tiny.tokens.jsonl", "[tokenizer]") {
  MARLINC_REQUIRE_SHARED();
  auto tok = load_tokenizer(test::shared_dir() / "data" / "stories260K");
  CHECK(tok->vocab_size() == 512);
  const std::string text = slurp(test::shared_dir() / "data" / "calib-tiny.utf8");
  auto docs = split_paragraphs(text);
  CHECK(docs.size() == 235);
  std::vector<std::vector<int32_t>> kept;
  size_t tokens = 0;
  for (const auto& d : docs) {
    auto ids = tok->encode(d, true);
    if (ids.size() >= kCalibTinyMinLen && ids.size() <= kCalibTinyMaxLen) {
      tokens += ids.size();
      kept.push_back(std::move(ids));
    }
  }
  CHECK(kept.size() == kCalibTinyDocs);
  CHECK(tokens == kCalibTinyTokens);
  auto golden = read_documents(test::shared_dir() / "data" / "stories260K" / "calib-tiny.tokens.jsonl", CalibFormat::Auto);
  REQUIRE(golden.format == CalibFormat::Tokens);
  REQUIRE(golden.ids.size() == kept.size());
  size_t same = 0;
  for (size_t i = 0; i < kept.size(); ++i) same += kept[i] == golden.ids[i];
  CHECK(same == kCalibTinyDocs);
}

TEST_CASE("BPE priority-queue merging equals the O(n^2) rescan", "[tokenizer]") {
  // Random merge tables over a small alphabet, random words: both loops must agree exactly.
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 200; ++trial) {
    MergeTable mt;
    const int alphabet = 4, nmerges = 12;
    int next_id = alphabet;
    std::vector<int> ids_seen{0, 1, 2, 3};
    for (int r = 0; r < nmerges; ++r) {
      int a = ids_seen[rng() % ids_seen.size()], b = ids_seen[rng() % ids_seen.size()];
      if (mt.find(a, b)) continue;
      mt.pairs.emplace(MergeTable::key(a, b), MergeTable::Merge{r, next_id});
      ids_seen.push_back(next_id++);
    }
    std::vector<int32_t> w(1 + rng() % 40);
    for (auto& x : w) x = static_cast<int32_t>(rng() % alphabet);
    auto fast = w, ref = w;
    bpe_merge(fast, mt);
    bpe_merge_ref(ref, mt);
    REQUIRE(fast == ref);
  }
}

TEST_CASE("BPE tokenization of megabytes of text is fast", "[tokenizer]") {
  MARLINC_REQUIRE_SHARED();
  // stories260K's files have no pre-tokenizer, so a whole document is one BPE word: this is the
  // case a quadratic merge loop would not survive (16,995 tokens in one word in calib-tiny).
  auto tok = load_tokenizer(test::shared_dir() / "data" / "stories260K");
  const std::string text = slurp(test::shared_dir() / "data" / "calib-tiny.utf8");
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text, true);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ids.size() > 60000);
  CHECK(tok->decode(ids) == text);
  WARN("stories260K tokenizer: " << text.size() / 1e6 / s << " MB/s on one word of " << text.size() << " bytes");
}

// ---- byte-level BPE (Llama-3 / Qwen style), on a tokenizer.json built here -------------------------

namespace {

// GPT-2's byte -> code point table, written out independently of the library's.
std::string byte_char(int b) {
  int n = 0;
  for (int x = 0; x < b; ++x) {
    bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    if (!printable) ++n;
  }
  bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  std::string s;
  utf8_append(s, printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n));
  return s;
}

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Vocab: the 256 byte characters (id = byte), merged pieces after them, then two specials.
json byte_level_tokenizer(bool merges_as_strings, int32_t& bos, std::map<std::string, int32_t>& vocab) {
  vocab.clear();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string G = byte_char(' ');  // "Ġ"
  std::vector<std::pair<std::string, std::string>> merges = {
      {"H", "e"}, {"l", "l"}, {"He", "ll"}, {"Hell", "o"}, {G, "w"}, {"o", "r"}, {G + "w", "or"}, {"l", "d"},
      {G + "wor", "ld"}, {"1", "2"}, {"12", "3"}};
  int32_t next = 256;
  json jm = json::array();
  for (auto& [a, b] : merges) {
    if (!vocab.count(a + b)) vocab[a + b] = next++;
    if (merges_as_strings) jm.push_back(a + " " + b);
    else jm.push_back(json::array({a, b}));
  }
  bos = next++;
  const int32_t eot = next++;
  json jv = json::object();
  for (auto& [k, v] : vocab) jv[k] = v;
  json added = json::array({{{"id", bos}, {"content", "<|begin_of_text|>"}, {"special", true}},
                            {{"id", eot}, {"content", "<|eot_id|>"}, {"special", true}}});
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors",
         json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                      {{"type", "TemplateProcessing"},
                       {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                       {"special_tokens",
                        {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}}})}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", true}, {"vocab", jv}, {"merges", jm}}}};
}

std::vector<std::string> pieces(std::string_view text, const SplitFlavor& f) {
  std::vector<std::string> out;
  for (auto v : regex_split(text, f)) out.emplace_back(v);
  return out;
}

}  // namespace

TEST_CASE("Regex pre-tokenizer splits like the GPT-2 and Llama-3 patterns", "[tokenizer]") {
  auto llama3 = flavor_from_pattern(kLlama3Pattern);
  REQUIRE(llama3.has_value());
  CHECK(!flavor_from_pattern(R"(\w+|\s+)").has_value());
  const std::string s = "Hello world's 12345  \n\n foo!!\n";
  CHECK(pieces(s, *llama3) ==
        std::vector<std::string>{"Hello", " world", "'s", " ", "123", "45", "  \n\n", " foo", "!!\n"});
  CHECK(pieces(s, gpt2_flavor()) ==
        std::vector<std::string>{"Hello", " world", "'s", " 12345", "  \n\n", " foo", "!!", "\n"});
  // Case-insensitive contractions and a punctuation prefix glued to letters only in Llama-3.
  CHECK(pieces("I'M ¡Hola", *llama3) == std::vector<std::string>{"I", "'M", " ¡", "Hola"});
  CHECK(pieces("I'M ¡Hola", gpt2_flavor()) == std::vector<std::string>{"I", "'", "M", " ¡", "Hola"});
  CHECK(pieces("¡Hola", *llama3) == std::vector<std::string>{"¡Hola"});
  CHECK(pieces("¡Hola", gpt2_flavor()) == std::vector<std::string>{"¡", "Hola"});
  // Non-ASCII letters and numbers come from the Unicode tables.
  CHECK(pieces("naïve 日本語 ٣٤", *llama3) == std::vector<std::string>{"naïve", " 日本語", " ", "٣٤"});
  CHECK(is_letter(U'ï'));
  CHECK(is_letter(U'語'));
  CHECK(!is_letter(U'¡'));
  CHECK(is_number(U'٣'));
  CHECK(is_whitespace(U'\u3000'));
  // Trailing whitespace at the end of text stays in one piece; the pieces always tile the text.
  CHECK(pieces("a   ", *llama3) == std::vector<std::string>{"a", "   "});
  std::mt19937_64 rng(7);
  const std::vector<std::string> alphabet = {"a", "Z", " ", "\n", "\r", "'", "s", "1", "!", "é", "語", "\t", "😀", "\xff"};
  for (int t = 0; t < 300; ++t) {
    std::string r;
    for (int i = 0, n = static_cast<int>(rng() % 30); i < n; ++i) r += alphabet[rng() % alphabet.size()];
    for (const SplitFlavor& f : {*llama3, gpt2_flavor()}) {
      std::string joined;
      for (auto& p : pieces(r, f)) {
        CHECK(!p.empty());
        joined += p;
      }
      CHECK(joined == r);
    }
  }
}

TEST_CASE("Byte-level BPE tokenizer.json (Llama-3 style) built in the test", "[tokenizer]") {
  int32_t bos = -1;
  std::map<std::string, int32_t> vocab;
  for (bool as_strings : {false, true}) {
    json tj = byte_level_tokenizer(as_strings, bos, vocab);
    auto tok = tokenizer_from_json_text(tj.dump(), "", "test-byte-level");
    CHECK(tok->bos_id() == bos);
    CHECK(tok->description().find("byte-level") != std::string::npos);
    const std::string G = byte_char(' ');
    CHECK(tok->encode("Hello world", true) == std::vector<int32_t>{bos, vocab.at("Hello"), vocab.at(G + "world")});
    CHECK(tok->encode("Hello world", false) == std::vector<int32_t>{vocab.at("Hello"), vocab.at(G + "world")});
    // "12345" -> pre-tokens "123", "45": the first merges fully, the second stays two bytes.
    CHECK(tok->encode("12345", false) == std::vector<int32_t>{vocab.at("123"), '4', '5'});
    // A special token inside text is split out; bytes outside ASCII become their byte characters.
    auto ids = tok->encode("é<|eot_id|>\n", false);
    CHECK(ids == std::vector<int32_t>{0xC3, 0xA9, bos + 1, '\n'});
    // decode maps characters back to bytes (including invalid UTF-8) and skips special tokens.
    for (std::string text : {std::string("Hello world, 12345 😀\n"), std::string("\xff\xfe bytes"), std::string("")}) {
      auto e = tok->encode(text, true);
      CHECK(tok->decode(e) == text);
    }
  }
  // tokenizer_config.json can turn BOS off, and EOS on.
  json tj = byte_level_tokenizer(false, bos, vocab);
  auto tok = tokenizer_from_json_text(tj.dump(), R"({"add_bos_token": false, "add_eos_token": true, "eos_token": "<|eot_id|>"})", "cfg");
  CHECK(tok->encode("Hello", true) == std::vector<int32_t>{vocab.at("Hello"), bos + 1});
  // Unknown pipeline parts are refused by name.
  tj["normalizer"] = {{"type", "BertNormalizer"}};
  std::string msg;
  try {
    tokenizer_from_json_text(tj.dump(), "", "bad");
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("BertNormalizer") != std::string::npos);
  // A Split on a plain string (Gemma's tokenizer.json from transformers 5: " ", MergedWithPrevious) puts
  // each match where its behaviour says, as Hugging Face tokenizers does; two spaces in a row keep the
  // second apart.
  const std::string G = byte_char(' ');
  auto with_split = [&](const char* behavior) {
    json t = byte_level_tokenizer(false, bos, vocab);
    t["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", behavior}};
    return tokenizer_from_json_text(t.dump(), "", std::string("split-") + behavior);
  };
  const int32_t Gi = vocab.at(G), w = 'w', orr = vocab.at("or"), ld = vocab.at("ld"), H = vocab.at("Hello");
  CHECK(with_split("MergedWithPrevious")->encode("Hello world", false) == std::vector<int32_t>{H, Gi, w, orr, ld});
  CHECK(with_split("MergedWithPrevious")->encode("Hello  world", false) == std::vector<int32_t>{H, Gi, Gi, w, orr, ld});
  CHECK(with_split("MergedWithNext")->encode("Hello world", false) == std::vector<int32_t>{H, vocab.at(G + "world")});
  CHECK(with_split("Isolated")->encode("Hello world", false) == std::vector<int32_t>{H, Gi, w, orr, ld});
  CHECK(with_split("Removed")->encode("Hello world", false) == std::vector<int32_t>{H, w, orr, ld});
  tj = byte_level_tokenizer(false, bos, vocab);
  tj["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Contiguous"}};
  msg.clear();
  try {
    tokenizer_from_json_text(tj.dump(), "", "bad");
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("Split pre-tokenizer behaviour 'Contiguous' on a plain-string pattern") != std::string::npos);
}

namespace {
std::string utf8_of_hex(const std::string& hex) {
  std::string out;
  std::istringstream ss(hex);
  for (std::string h; ss >> h;) utf8_append(out, char32_t(std::stoul(h, nullptr, 16)));
  return out;
}
}  // namespace

TEST_CASE("NFC equals Python's unicodedata on every composing code point and random mark runs", "[tokenizer][nfc]") {
  // tests/data/nfc-vectors.txt: tests/calib/make_nfc_vectors.py, from the Unicode version the tables were
  // generated from.
  std::ifstream f(std::filesystem::path(MARLINC_SOURCE_DIR) / "tests" / "data" / "nfc-vectors.txt");
  REQUIRE(f.good());
  size_t vectors = 0, changed = 0, wrong = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t semi = line.find(';');
    REQUIRE(semi != std::string::npos);
    const std::string in = utf8_of_hex(line.substr(0, semi)), want = utf8_of_hex(line.substr(semi + 1));
    const std::string got = nfc(in);
    ++vectors;
    changed += in != want;
    if (got != want && ++wrong <= 5) FAIL_CHECK("NFC of " << line.substr(0, semi) << " should be " << line.substr(semi + 1));
  }
  CHECK(vectors == 10919);
  CHECK(changed > 4000);  // the vectors exercise normalization, not only the fast path
  CHECK(wrong == 0);
  // Invalid bytes stay as they are and nothing composes across them.
  CHECK(nfc("e\xcc\x81") == "\xc3\xa9");          // e + U+0301 -> U+00E9
  CHECK(nfc("e\x80\xcc\x81") == "e\x80\xcc\x81");
  CHECK(nfc("e\xcc\x81\xff") == "\xc3\xa9\xff");
  CHECK(nfc("plain ASCII") == "plain ASCII");
}

TEST_CASE("An NFC normalizer tokenizes decomposed text as its composed form (Qwen2 and GPT-NeoX style)", "[tokenizer][nfc]") {
  // Before, any combining mark was refused ("only already-normalized text is supported"), so already-NFC
  // Hindi or Bengali calibration text could not be used with Qwen's tokenizers (found by an audit
  // against Hugging Face tokenizers).
  int32_t bos = -1;
  std::map<std::string, int32_t> vocab;
  json tj = byte_level_tokenizer(false, bos, vocab);
  tj["normalizer"] = {{"type", "NFC"}};
  auto tok = tokenizer_from_json_text(tj.dump(), "", "test-nfc");
  const std::string composed = "caf\xc3\xa9 \xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80";  // café हिन्दी
  const std::string decomposed = "cafe\xcc\x81 \xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80";
  CHECK(tok->encode(decomposed, false) == tok->encode(composed, false));
  CHECK(tok->encode(composed, false).size() > 4);
  // Without the normalizer the two differ.
  tj.erase("normalizer");
  auto plain = tokenizer_from_json_text(tj.dump(), "", "test-plain");
  CHECK(plain->encode(decomposed, false) != plain->encode(composed, false));
}

TEST_CASE("lstrip and rstrip of added tokens take Unicode whitespace as Hugging Face tokenizers does", "[tokenizer]") {
  // Phi-3's chat tokens strip to their right, RoBERTa-style <mask> to its left; HF strips every
  // White_Space character (found by an audit: only ASCII whitespace was stripped).
  int32_t bos = -1;
  std::map<std::string, int32_t> vocab;
  json tj = byte_level_tokenizer(false, bos, vocab);
  tj["added_tokens"].push_back({{"id", bos + 2}, {"content", "<|end|>"}, {"special", true}, {"rstrip", true}});
  tj["added_tokens"].push_back({{"id", bos + 3}, {"content", "<mask>"}, {"special", true}, {"lstrip", true}});
  auto tok = tokenizer_from_json_text(tj.dump(), "", "test-strip");
  const auto plain = tok->encode("Hello<|end|>world", false);
  CHECK(plain == std::vector<int32_t>{vocab.at("Hello"), bos + 2, 'w', vocab.at("or"), vocab.at("ld")});
  for (const char* ws : {" ", "\xc2\xa0", "\xe3\x80\x80", " \xc2\xa0\t"}) {  // space, U+00A0, U+3000, a mix
    INFO("whitespace bytes " << ws);
    CHECK(tok->encode(std::string("Hello<|end|>") + ws + "world", false) == plain);
    CHECK(tok->encode(std::string("Hello") + ws + "<mask>", false) == std::vector<int32_t>{vocab.at("Hello"), bos + 3});
  }
  // Not whitespace: kept (U+00E9 and an invalid byte).
  CHECK(tok->encode("Hello<|end|>\xc3\xa9", false).size() == 4);
  CHECK(tok->encode("Hello<|end|>\x80", false).size() == 3);
}

TEST_CASE("tokenizer.json ids and nesting from a crafted file are refused by name, not allocated", "[tokenizer]") {
  // Found by fuzz_tokenizer_json: one vocab id of 232000000 sized the id -> token table at 7.4 GB.
  int32_t bos = -1;
  std::map<std::string, int32_t> vocab;
  const json good = byte_level_tokenizer(false, bos, vocab);
  auto refusal = [](const json& tj) {
    try {
      tokenizer_from_json_text(tj.dump(), "", "crafted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::BadData);
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(refusal(good).empty());
  json huge = good;
  huge["model"]["vocab"]["H"] = 232000000;
  CHECK(refusal(huge).find("is outside 0..16777215") != std::string::npos);
  json sparse = good;
  sparse["model"]["vocab"]["H"] = 100000;  // 267 tokens cannot reach id 100000
  CHECK(refusal(sparse).find("model.vocab reaches id 100000 with only 267 tokens") != std::string::npos);
  json fractional = good;
  fractional["model"]["vocab"]["H"] = 72.5;
  CHECK(refusal(fractional).find("72.5, not an integer id") != std::string::npos);
  json added = good;
  added["added_tokens"][0]["id"] = 9000000;
  CHECK(refusal(added).find("added_tokens reaches id 9000000") != std::string::npos);
  json special = good;
  special["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = json::array({5000});
  CHECK(refusal(special).find("is past the vocabulary") != std::string::npos);
  json deep = good;
  json n = {{"type", "NFC"}};
  for (int i = 0; i < 12; ++i) n = {{"type", "Sequence"}, {"normalizers", json::array({n})}};
  deep["normalizer"] = n;
  CHECK(refusal(deep).find("normalizer Sequence nested deeper than 8 levels") != std::string::npos);
  json shallow = good;
  json s1 = {{"type", "NFC"}};
  for (int i = 0; i < 3; ++i) s1 = {{"type", "Sequence"}, {"normalizers", json::array({s1})}};
  shallow["normalizer"] = s1;
  CHECK(refusal(shallow).empty());
}
