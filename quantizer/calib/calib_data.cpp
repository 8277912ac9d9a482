#include "quantizer/calib/calib_data.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "checkpoint/error.h"
#include "checkpoint/json_strict.h"
#include "checkpoint/sha256.h"

namespace marlinc::calib {

using nlohmann::json;

CalibFormat calib_format_from_name(std::string_view n) {
  if (n == "auto") return CalibFormat::Auto;
  if (n == "text") return CalibFormat::Text;
  if (n == "text-whole") return CalibFormat::TextWhole;
  if (n == "jsonl") return CalibFormat::Jsonl;
  if (n == "tokens") return CalibFormat::Tokens;
  bad_usage("calibration format '" + std::string(n) + "' is unknown (use auto, text, text-whole, jsonl or tokens)");
}

std::string_view calib_format_name(CalibFormat f) {
  switch (f) {
    case CalibFormat::Auto: return "auto";
    case CalibFormat::Text: return "text";
    case CalibFormat::TextWhole: return "text-whole";
    case CalibFormat::Jsonl: return "jsonl";
    case CalibFormat::Tokens: return "tokens";
  }
  return "?";
}

json CalibSet::to_json() const {
  return json{{"name", name},        {"sha256", sha256},   {"format", format},
              {"samples", samples.size()}, {"tokens", tokens}, {"requested", requested},
              {"documents", documents}, {"documents_seen", documents_seen}, {"seed", seed},
              {"min_len", min_len},  {"max_len", max_len}, {"window", window}};
}

std::vector<std::string> split_paragraphs(std::string_view text) {
  std::vector<std::string> docs;
  auto flush = [&](size_t b, size_t e) {
    while (b < e && (text[b] == '\n' || text[b] == '\r')) ++b;
    while (e > b && (text[e - 1] == '\n' || text[e - 1] == '\r')) --e;
    if (e > b) docs.emplace_back(text.substr(b, e - b));
  };
  size_t doc_begin = 0, line = 0;
  while (line < text.size()) {
    size_t nl = text.find('\n', line);
    size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    bool blank = true;
    for (size_t i = line; i < line_end && blank; ++i) blank = text[i] == ' ' || text[i] == '\t' || text[i] == '\r';
    if (blank && line_end > 0 && nl != std::string_view::npos) {
      flush(doc_begin, line);
      doc_begin = line_end + 1;
    }
    line = nl == std::string_view::npos ? text.size() : nl + 1;
  }
  flush(doc_begin, text.size());
  return docs;
}

uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  // Reject draws from the incomplete last copy of [0, n) so every residue is equally likely.
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}

std::vector<size_t> seeded_permutation(size_t n, uint64_t seed) {
  std::vector<size_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) std::swap(p[i - 1], p[uniform_below(rng, i)]);
  return p;
}

namespace {

// A path that does not exist is the user's to fix (exit 2, as for the model directory); one that exists
// but cannot be read is the system's (exit 1).
[[noreturn]] void cannot_open(const std::filesystem::path& p) {
  std::error_code ec;
  (void)std::filesystem::status(p, ec);  // a parent that cannot be searched is not "no such file"
  if (ec == std::errc::no_such_file_or_directory) bad_usage("--calib " + p.string() + ": no such file");
  fail(ErrorKind::Io, p.string() + ": cannot open the calibration file" + (ec ? " (" + ec.message() + ")" : ""));
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) cannot_open(p);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(ErrorKind::Io, p.string() + ": read failed");
  return ss.str();
}

std::vector<int32_t> ids_of(const json& v, const std::string& where) {
  const json* arr = &v;
  if (v.is_object()) {
    for (const char* k : {"input_ids", "ids", "tokens"})
      if (v.contains(k)) { arr = &v[k]; break; }
  }
  if (!arr->is_array()) bad_data(where + ": expected an array of token ids (or an object with input_ids/ids/tokens)");
  std::vector<int32_t> out;
  out.reserve(arr->size());
  for (const json& x : *arr) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      bad_data(where + ": token ids must be non-negative 32-bit integers");
    out.push_back(x.get<int32_t>());
  }
  return out;
}

}  // namespace

namespace {

// Auto: by the first non-empty line.
CalibFormat detect_format(const std::string& bytes) {
  const size_t b = bytes.find_first_not_of(" \t\r\n");
  if (b == std::string::npos || (bytes[b] != '{' && bytes[b] != '[')) return CalibFormat::Text;
  const size_t e = bytes.find('\n', b);
  const json first = json::parse(bytes.substr(b, e == std::string::npos ? std::string::npos : e - b), nullptr, false);
  if (first.is_array()) return CalibFormat::Tokens;
  if (first.is_object() && first.contains("text")) return CalibFormat::Jsonl;
  if (first.is_object() && (first.contains("input_ids") || first.contains("ids") || first.contains("tokens")))
    return CalibFormat::Tokens;
  return CalibFormat::Text;
}

}  // namespace

// Auto looks at the first non-empty line only: read that much, not the whole file read_documents reads after.
CalibFormat resolve_calib_format(const std::filesystem::path& path, CalibFormat format) {
  if (format != CalibFormat::Auto) return format;
  std::ifstream f(path, std::ios::binary);
  if (!f) cannot_open(path);
  std::string line;
  while (std::getline(f, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
  }
  if (f.bad()) fail(ErrorKind::Io, path.string() + ": read failed");
  return detect_format(line);
}

CalibDocuments read_documents(const std::filesystem::path& path, CalibFormat format) {
  const std::string bytes = read_file(path);
  CalibDocuments d;
  {
    if (format == CalibFormat::Auto) format = detect_format(bytes);
    d.format = format;
    // Text formats are UTF-8, as tokenizers take them (JSONL strings are checked by the JSON parser).
    if (format == CalibFormat::Text || format == CalibFormat::TextWhole)
      if (const size_t bad = detail::utf8_invalid_at(bytes); bad != std::string_view::npos)
        bad_data(path.string() + ": not UTF-8 text (invalid byte at offset " + std::to_string(bad) +
                 "); calibration text must be UTF-8");
    switch (format) {
      case CalibFormat::Text: d.texts = split_paragraphs(bytes); break;
      case CalibFormat::TextWhole: if (!bytes.empty()) d.texts.push_back(bytes); break;
      case CalibFormat::Jsonl:
      case CalibFormat::Tokens: {
        size_t line_no = 0, pos = 0;
        while (pos < bytes.size()) {
          size_t e = bytes.find('\n', pos);
          if (e == std::string::npos) e = bytes.size();
          std::string_view line(bytes.data() + pos, e - pos);
          pos = e + 1;
          ++line_no;
          if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
          const std::string where = path.string() + ":" + std::to_string(line_no);
          json v = json::parse(line, nullptr, false);
          if (v.is_discarded()) bad_data(where + ": not valid JSON");
          if (format == CalibFormat::Tokens) {
            d.ids.push_back(ids_of(v, where));
          } else {
            if (!v.is_object() || !v.contains("text") || !v["text"].is_string())
              bad_data(where + ": expected an object with a \"text\" string (or use --calib-format tokens)");
            d.texts.push_back(v["text"].get<std::string>());
          }
        }
        break;
      }
      case CalibFormat::Auto: break;
    }
  }
  return d;
}

CalibSet load_calibration(const std::filesystem::path& path, const Tokenizer* tok, const CalibOptions& opt) {
  if (opt.min_len < 1 || opt.min_len > opt.max_len)
    bad_usage("calibration lengths: need 1 <= --min-len (" + std::to_string(opt.min_len) + ") <= --max-len (" +
              std::to_string(opt.max_len) + ")");
  if (opt.samples == 0) bad_usage("calibration: --samples must be at least 1");
  CalibDocuments docs = read_documents(path, opt.format);
  if (docs.format != CalibFormat::Tokens && !tok)
    bad_usage(path.string() + ": a text calibration file needs the model's tokenizer");
  CalibSet set;
  set.name = path.filename().string();
  set.sha256 = sha256_file(path);
  set.format = std::string(calib_format_name(docs.format));
  set.documents = docs.size();
  set.requested = opt.samples;
  set.seed = opt.seed;
  set.min_len = opt.min_len;
  set.max_len = opt.max_len;
  set.window = opt.window;
  auto tokens_of = [&](size_t i) {
    return docs.format == CalibFormat::Tokens ? docs.ids[i] : tok->encode(docs.texts[i], opt.add_bos);
  };
  if (opt.window == 0) {
    for (size_t i : seeded_permutation(docs.size(), opt.seed)) {
      if (set.samples.size() == opt.samples) break;
      std::vector<int32_t> t = tokens_of(i);
      ++set.documents_seen;
      if (t.size() < opt.min_len || t.size() > opt.max_len) continue;
      set.tokens += t.size();
      set.samples.push_back(std::move(t));
    }
  } else {
    std::vector<int32_t> stream;
    for (size_t i = 0; i < docs.size(); ++i) {
      std::vector<int32_t> t = tokens_of(i);
      stream.insert(stream.end(), t.begin(), t.end());
    }
    set.documents_seen = docs.size();
    const size_t nwin = stream.size() / opt.window;
    for (size_t w : seeded_permutation(nwin, opt.seed)) {
      if (set.samples.size() == opt.samples) break;
      set.samples.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(w * opt.window),
                               stream.begin() + static_cast<std::ptrdiff_t>((w + 1) * opt.window));
      set.tokens += opt.window;
    }
  }
  if (set.samples.empty())
    bad_data(path.string() + ": no calibration sample has between " + std::to_string(opt.min_len) + " and " +
             std::to_string(opt.max_len) + " tokens (" + std::to_string(set.documents) +
             " documents read); lower --min-len or raise --max-len");
  return set;
}

}  // namespace marlinc::calib
