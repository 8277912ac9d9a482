// Calibration data (spec: ../shared/spec/gptq.md §3): documents read from text, JSONL or
// pre-tokenized JSONL, and variable-length sampling of whole documents — no padding, no truncation,
// no fixed windows unless asked. The record (name, sha256, samples, tokens) goes into the output's
// metadata so a quantized checkpoint says what it was calibrated on.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantizer/calib/tokenizer.h"

namespace marlinc::calib {

enum class CalibFormat {
  Auto,        // by content: JSONL whose first record is an array or has ids -> Tokens, has "text" -> Jsonl; else Text
  Text,        // plain text; one document per blank-line-separated paragraph
  TextWhole,   // plain text; the whole file is one document
  Jsonl,       // one JSON object per line with a "text" string
  Tokens,      // one JSON array of ids per line (or an object with "input_ids"/"ids"/"tokens"), used as-is
};
CalibFormat calib_format_from_name(std::string_view name);  // auto|text|text-whole|jsonl|tokens; BadUsage otherwise
std::string_view calib_format_name(CalibFormat f);

struct CalibOptions {
  CalibFormat format = CalibFormat::Auto;
  size_t samples = 128;   // N: how many samples to draw (fewer when fewer documents qualify)
  size_t min_len = 2;     // shortest accepted document, in tokens (BOS included)
  size_t max_len = 2048;  // longest accepted document; longer ones are skipped, never truncated
  uint64_t seed = 0;
  size_t window = 0;      // > 0: fixed windows of this many tokens instead of whole documents
  bool add_bos = true;    // text is tokenized with the model's special tokens (tokenizer.encode(text, true))
};

struct CalibSet {
  std::string name;    // file name (no directories: metadata must not leak paths)
  std::string sha256;  // of the file's bytes
  std::string format;  // calib_format_name of what was read
  std::vector<std::vector<int32_t>> samples;  // each [len_i] token ids, len_i in [min_len, max_len]
  size_t tokens = 0;           // sum of len_i
  size_t documents = 0;        // documents in the file
  size_t documents_seen = 0;   // documents tokenized while sampling (the walk stops at N accepted)
  size_t requested = 0;        // N asked for
  uint64_t seed = 0;
  size_t min_len = 0, max_len = 0, window = 0;
  nlohmann::json to_json() const;  // the metadata record (no token ids)
};

// Splits text into documents at blank lines (lines holding only spaces, tabs or '\r'); each document
// has its surrounding newlines stripped; empty documents are dropped.
std::vector<std::string> split_paragraphs(std::string_view text);

// The seeded PRNG of sampling, fixed so that a seed means the same samples on every platform:
// std::mt19937_64 (its output sequence is fixed by the standard) and an unbiased draw by rejection
// (std::uniform_int_distribution is implementation-defined, so it is not used).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n);  // uniform in [0, n), n > 0
// Fisher-Yates from the back: for i = n-1 .. 1 swap(p[i], p[uniform_below(rng, i + 1)]).
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);

// Reads the file and draws the samples. Whole documents: walk seeded_permutation(documents, seed),
// tokenize each, keep it when min_len <= len <= max_len, stop at N kept (Marlin's scheme). Windows
// (window > 0): concatenate all documents' tokens in file order, cut non-overlapping windows of
// exactly `window` tokens, and take the first N of a seeded permutation of them. The tokenizer may be
// null only for pre-tokenized files. Throws BadData/BadUsage/Io naming the file, line and rule.
CalibSet load_calibration(const std::filesystem::path& path, const Tokenizer* tok, const CalibOptions& opt);

// The documents of a file as text (Text/TextWhole/Jsonl), or their ids (Tokens); `format` is resolved
// from Auto. Exposed for tests and for `marlinc ppl`-style tools that need the same reading rules.
struct CalibDocuments {
  CalibFormat format = CalibFormat::Auto;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  size_t size() const { return format == CalibFormat::Tokens ? ids.size() : texts.size(); }
};
CalibDocuments read_documents(const std::filesystem::path& path, CalibFormat format);
// The format read_documents would read `path` as (Auto resolved by content; others as given).
CalibFormat resolve_calib_format(const std::filesystem::path& path, CalibFormat format);

}  // namespace marlinc::calib
