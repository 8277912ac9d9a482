// Calibration data: reading text / JSONL / pre-tokenized files, the seeded sampler, the record.
#include <fstream>
#include <set>

#include "checkpoint/error.h"
#include "checkpoint/sha256.h"
#include "quantizer/calib/calib_data.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::calib;

namespace {

void write(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// A tokenizer whose ids are the bytes of the text (+1 so that 0 can be BOS): lengths are predictable.
struct ByteTokenizer : Tokenizer {
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(0);
    for (unsigned char c : text) ids.push_back(c + 1);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t i : ids) if (i > 0) s.push_back(static_cast<char>(i - 1));
    return s;
  }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return -1; }
  int32_t vocab_size() const override { return 257; }
  std::string description() const override { return "bytes"; }
};

}  // namespace

TEST_CASE("split_paragraphs: blank lines separate documents, surrounding newlines stripped", "[calib]") {
  CHECK(split_paragraphs("a\nb\n\nc\n \t\n\n\nd\r\n\r\ne\n") == std::vector<std::string>{"a\nb", "c", "d", "e"});
  CHECK(split_paragraphs("\n\n\n").empty());
  CHECK(split_paragraphs("one") == std::vector<std::string>{"one"});
  CHECK(split_paragraphs("x\n  y\n") == std::vector<std::string>{"x\n  y"});  // an indented line is not blank
}

TEST_CASE("seeded permutation: a fixed mt19937_64 stream and unbiased draws", "[calib]") {
  // std::mt19937_64's 10000th output for the default seed is fixed by the C++ standard.
  std::mt19937_64 rng;
  uint64_t x = 0;
  for (int i = 0; i < 10000; ++i) x = rng();
  CHECK(x == 9981545732273789042ull);
  auto p = seeded_permutation(100, 42);
  CHECK(p == seeded_permutation(100, 42));
  CHECK(p != seeded_permutation(100, 43));
  CHECK(std::set<size_t>(p.begin(), p.end()).size() == 100);
  // The first draws of seed 1 are pinned: a change of PRNG or draw rule changes every calibration set.
  std::mt19937_64 r1(1);
  std::vector<uint64_t> d;
  for (int i = 0; i < 4; ++i) d.push_back(uniform_below(r1, 10));
  std::mt19937_64 r2(1);
  for (int i = 0; i < 4; ++i) CHECK(d[i] == r2() % 10);  // no rejection happens this far below 2^64
  // Roughly uniform: each of 8 values drawn about 1/8 of the time.
  std::mt19937_64 r3(7);
  std::vector<int> counts(8);
  for (int i = 0; i < 80000; ++i) ++counts[uniform_below(r3, 8)];
  for (int c : counts) CHECK(std::abs(c - 10000) < 500);
}

TEST_CASE("load_calibration samples whole documents within [min, max]", "[calib]") {
  test::TempDir dir("calib");
  const auto path = dir.path / "docs.txt";
  // Documents of 1..30 bytes; with BOS, lengths 2..31.
  std::string text;
  for (int i = 1; i <= 30; ++i) text += std::string(static_cast<size_t>(i), static_cast<char>('a' + i % 26)) + "\n\n";
  write(path, text);
  ByteTokenizer tok;
  CalibOptions opt;
  opt.samples = 8;
  opt.min_len = 10;
  opt.max_len = 20;
  opt.seed = 3;
  CalibSet s = load_calibration(path, &tok, opt);
  CHECK(s.documents == 30);
  CHECK(s.samples.size() == 8);
  CHECK(s.format == "text");
  CHECK(s.name == "docs.txt");
  CHECK(s.sha256 == sha256_file(path));
  size_t total = 0;
  std::set<size_t> lens;
  for (const auto& smp : s.samples) {
    CHECK(smp.size() >= 10);
    CHECK(smp.size() <= 20);
    CHECK(smp[0] == 0);  // BOS
    total += smp.size();
    lens.insert(smp.size());
  }
  CHECK(lens.size() == 8);  // whole distinct documents, no truncation or padding
  CHECK(s.tokens == total);
  // Same seed, same samples; another seed, another draw.
  CHECK(load_calibration(path, &tok, opt).samples == s.samples);
  opt.seed = 4;
  CHECK(load_calibration(path, &tok, opt).samples != s.samples);
  // Asking for more than qualify gives all of them (11 documents have 10..20 tokens).
  opt.samples = 100;
  CalibSet all = load_calibration(path, &tok, opt);
  CHECK(all.samples.size() == 11);
  CHECK(all.documents_seen == 30);
  auto j = all.to_json();
  CHECK(j["samples"] == 11);
  CHECK(j["requested"] == 100);
  CHECK(j["sha256"] == all.sha256);
  // Nothing qualifies: an error naming the file and the flags.
  opt.min_len = 100;
  opt.max_len = 200;
  REQUIRE_THROWS_AS(load_calibration(path, &tok, opt), Error);
  opt.min_len = 5;
  opt.max_len = 4;
  REQUIRE_THROWS_AS(load_calibration(path, &tok, opt), Error);
}

// Calibration text is UTF-8: a file that is not (Latin-1 bytes, a cut multi-byte character, binary) is refused,
// naming the file and the first bad byte's offset, in both text formats.
TEST_CASE("load_calibration refuses text that is not UTF-8 and names the file and the offset", "[calib]") {
  test::TempDir dir("calib-utf8");
  ByteTokenizer tok;
  CalibOptions opt;
  opt.samples = 1;
  opt.min_len = 1;
  const auto path = dir.path / "latin1.txt";
  for (CalibFormat f : {CalibFormat::Auto, CalibFormat::Text, CalibFormat::TextWhole}) {
    opt.format = f;
    write(path, "caf\xe9 au lait\n");  // Latin-1 e acute
    std::string msg;
    try {
      load_calibration(path, &tok, opt);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(path.string() + ": not UTF-8 text (invalid byte at offset 3)") != std::string::npos);
    write(path, "ok \xc3");  // a character cut off at the end
    CHECK_THROWS_AS(load_calibration(path, &tok, opt), Error);
  }
  opt.format = CalibFormat::Text;
  write(path, "caf\xc3\xa9 au lait\n");  // the same word in UTF-8 reads
  CHECK(load_calibration(path, &tok, opt).samples.size() == 1);
}

TEST_CASE("load_calibration reads JSONL text, pre-tokenized ids and fixed windows", "[calib]") {
  test::TempDir dir("calibj");
  ByteTokenizer tok;
  CalibOptions opt;
  opt.samples = 10;
  opt.min_len = 2;
  const auto jl = dir.path / "t.jsonl";
  write(jl, "{\"text\": \"hello\"}\n\n{\"text\": \"hi\", \"meta\": 1}\n");
  CalibSet a = load_calibration(jl, &tok, opt);
  CHECK(a.format == "jsonl");
  CHECK(a.samples.size() == 2);
  CHECK(a.tokens == 6 + 3);
  const auto tk = dir.path / "ids.jsonl";
  write(tk, "[1, 5, 6]\n{\"input_ids\": [1, 7]}\n[1]\n");
  CalibSet b = load_calibration(tk, nullptr, opt);  // ids need no tokenizer
  CHECK(b.format == "tokens");
  CHECK(b.documents == 3);
  CHECK(b.samples.size() == 2);  // [1] is shorter than min_len 2
  write(tk, "[1, -5]\n");
  REQUIRE_THROWS_AS(load_calibration(tk, nullptr, opt), Error);
  write(jl, "{\"txt\": \"x\"}\n");
  REQUIRE_THROWS_AS(load_calibration(jl, &tok, CalibOptions{CalibFormat::Jsonl}), Error);
  // Fixed windows: cut the concatenated stream into exactly `window`-token pieces.
  const auto txt = dir.path / "w.txt";
  write(txt, "abcdefghij\n\nklmnopqrst\n\nuvwxyz");
  opt.window = 4;
  opt.samples = 3;
  CalibSet w = load_calibration(txt, &tok, opt);
  CHECK(w.samples.size() == 3);
  for (const auto& smp : w.samples) CHECK(smp.size() == 4);
  CHECK(w.tokens == 12);
  // The whole file as one document.
  opt.window = 0;
  opt.format = CalibFormat::TextWhole;
  opt.max_len = 1000;
  CalibSet whole = load_calibration(txt, &tok, opt);
  CHECK(whole.samples.size() == 1);
  CHECK(whole.samples[0].size() == 1 + 10 + 2 + 10 + 2 + 6);
  REQUIRE_THROWS_AS(calib_format_from_name("csv"), Error);
}

TEST_CASE("stories260K calibration tokens load as pre-tokenized samples", "[calib]") {
  MARLINC_REQUIRE_SHARED();
  CalibOptions opt;
  opt.samples = 1000;
  opt.max_len = 512;
  CalibSet s = load_calibration(test::shared_dir() / "data" / "stories260K" / "calib-tiny.tokens.jsonl", nullptr, opt);
  CHECK(s.samples.size() == 163);
  CHECK(s.tokens == 66217);
}
