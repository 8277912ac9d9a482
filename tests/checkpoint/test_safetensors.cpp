// safetensors header validation: every malformed input names its rule; valid files (hand-made and
// ../shared) read back with the right tensors.
#include <cmath>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert_dtype.h"
#include "checkpoint/safetensors.h"
#include "tests/checkpoint/st_util.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::test;

namespace {

// Parses `bytes` as a whole file and returns the BadData message ("" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    parse_safetensors_header(bytes.data(), bytes.size(), bytes.size(), "f.safetensors");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::BadData);
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

const std::string kA = R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]})";

}  // namespace

TEST_CASE("parser accepts a minimal valid file and reports offsets and metadata") {
  auto b = raw_safetensors(R"({"__metadata__":{"format":"pt"},)" + kA + R"(,"b":{"dtype":"I32","shape":[],"data_offsets":[4,8]}})",
                           {0, 0x3c, 0, 0x40, 1, 0, 0, 0});
  auto h = parse_safetensors_header(b.data(), b.size(), b.size(), "f");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "a");
  CHECK(h.tensors[0].dtype == DType::F16);
  CHECK(h.tensors[0].numel() == 2);
  CHECK(h.tensors[1].name == "b");
  CHECK(h.tensors[1].shape.empty());
  CHECK(h.tensors[1].numel() == 1);
  CHECK(h.tensors[1].nbytes() == 4);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.data_start == 8 + b.size() - 16);
}

TEST_CASE("parser accepts empty tensors, header padding and offset order different from key order") {
  auto b = raw_safetensors(R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}   )",
                           {1, 2, 3, 4, 5, 6});
  auto h = parse_safetensors_header(b.data(), b.size(), b.size(), "f");
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.tensors[0].name == "z");
  CHECK(h.tensors[1].name == "e");
  CHECK(h.tensors[1].nbytes() == 0);
  CHECK(h.tensors[2].name == "a");
}

// A header of many tensors, as a model's largest shards have (tens of thousands): every entry parsed, in offset
// order, and a duplicate among them still named. (The duplicate-key check once rescanned the whole object at every
// entry: 40k tensors took 25 s, 500k more than two minutes; tests/checkpoint holds no timing, the count is the check.)
TEST_CASE("parser reads a header of 100k tensors and finds a duplicate among them", "[checkpoint]") {
  constexpr int kTensors = 100000;
  std::string header = "{";
  for (int i = kTensors - 1; i >= 0; --i)  // keys in reverse offset order
    header += (i == kTensors - 1 ? "" : ",") + std::string("\"t") + std::to_string(i) +
              R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" + std::to_string(i) + "," + std::to_string(i + 1) +
              "]}";
  const std::vector<uint8_t> data(kTensors, 7);
  auto b = raw_safetensors(header + "}", data);
  auto h = parse_safetensors_header(b.data(), b.size(), b.size(), "f");
  REQUIRE(h.tensors.size() == size_t(kTensors));
  CHECK(h.tensors.front().name == "t0");
  CHECK(h.tensors.back().name == "t" + std::to_string(kTensors - 1));
  const std::string dup = R"(,"t5":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
  auto d = raw_safetensors(header + dup, data);
  CHECK(contains(parse_error(d), "t5: duplicate key"));
}

TEST_CASE("every malformed header yields its named error") {
  const std::vector<uint8_t> d4 = {0, 0x3c, 0, 0x40};
  SECTION("truncated: shorter than the length field") {
    std::vector<uint8_t> b = {1, 2, 3};
    CHECK(contains(parse_error(b), "truncated file"));
    CHECK(contains(parse_error({}), "truncated file"));
  }
  SECTION("header length past EOF") {
    auto b = raw_safetensors("{" + kA + "}", d4, 5000);
    auto e = parse_error(b);
    CHECK(contains(e, "runs past the end of the file"));
    CHECK(contains(e, "f.safetensors"));
  }
  SECTION("header length over the cap") {
    auto b = raw_safetensors("{" + kA + "}", d4, 100'000'001ull);
    CHECK(contains(parse_error(b), "exceeds the 100000000-byte cap"));
    auto huge = raw_safetensors("{}", {}, UINT64_MAX - 1);
    CHECK(contains(parse_error(huge), "cap"));
  }
  SECTION("malformed JSON") {
    CHECK(contains(parse_error(raw_safetensors(R"({"a":{"dtype":"F16",)", d4)), "malformed JSON"));
    CHECK(contains(parse_error(raw_safetensors(R"({"a" 1})", {})), "malformed JSON"));
  }
  SECTION("not a JSON object") {
    CHECK(contains(parse_error(raw_safetensors("[1, 2]", {})), "does not start with '{'"));
    CHECK(contains(parse_error(raw_safetensors(" {}", {})), "does not start with '{'"));
  }
  SECTION("invalid UTF-8") {
    std::string h = std::string("{\"a") + '\xff' + R"(":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
    CHECK(contains(parse_error(raw_safetensors(h, d4)), "not valid UTF-8"));
  }
  SECTION("unknown dtype") {
    auto e = parse_error(raw_safetensors(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,4]}})", d4));
    CHECK(contains(e, "f.safetensors: w: unknown dtype \"Q4\""));
  }
  SECTION("shape x dtype size != byte range") {
    auto e = parse_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", d4));
    CHECK(contains(e, "w: shape [2] x F32"));
    CHECK(contains(e, "= 8 bytes but data_offsets [0,4] span 4 bytes"));
  }
  SECTION("negative or fractional dims and offsets") {
    CHECK(contains(parse_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", d4)),
                   "not a non-negative integer"));
    CHECK(contains(parse_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})", d4)),
                   "not a non-negative integer"));
    CHECK(contains(parse_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}})", d4)),
                   "end before they begin"));
    CHECK(contains(parse_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", d4)),
                   "data_offsets"));
  }
  SECTION("shape overflow") {
    auto e = parse_error(raw_safetensors(
        R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", d4));
    CHECK(contains(e, "overflows"));
  }
  SECTION("overlapping ranges") {
    auto e = parse_error(raw_safetensors(
        R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", d4));
    CHECK(contains(e, "b: byte range [2, 4) overlaps tensor a"));
  }
  SECTION("hole between tensors") {
    auto e = parse_error(raw_safetensors(
        R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", d4));
    CHECK(contains(e, "b: hole in the data buffer: bytes [1, 2)"));
  }
  SECTION("hole at the start") {
    auto e = parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", d4));
    CHECK(contains(e, "a: hole"));
  }
  SECTION("trailing bytes after the last tensor") {
    auto e = parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", d4));
    CHECK(contains(e, "a: data buffer is 4 bytes but the tensors cover 2"));
  }
  SECTION("range outside the buffer (truncated data)") {
    auto e = parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", d4));
    CHECK(contains(e, "a: data_offsets [0, 8] run past the end of the data buffer (4 bytes)"));
  }
  SECTION("duplicate tensor names") {
    auto e = parse_error(raw_safetensors(
        R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", d4));
    CHECK(contains(e, "a: duplicate key"));
  }
  SECTION("non-string metadata") {
    auto e = parse_error(raw_safetensors(R"({"__metadata__":{"format":"pt","n":3},)" + kA + "}", d4));
    CHECK(contains(e, "__metadata__: value of \"n\" is number"));
    CHECK(contains(parse_error(raw_safetensors(R"({"__metadata__":[1],)" + kA + "}", d4)), "__metadata__ is not a JSON object"));
  }
  SECTION("entry that is not an object / missing keys") {
    CHECK(contains(parse_error(raw_safetensors(R"({"a":5})", {})), "a: header entry is not a JSON object"));
    CHECK(contains(parse_error(raw_safetensors(R"({"a":{"shape":[0],"data_offsets":[0,0]}})", {})), "a: missing or non-string \"dtype\""));
    CHECK(contains(parse_error(raw_safetensors(R"({"a":{"dtype":"U8","data_offsets":[0,0]}})", {})), "a: missing or non-array \"shape\""));
  }
  SECTION("deep nesting is refused, not recursed into") {
    std::string h = "{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
    CHECK(contains(parse_error(raw_safetensors(h, {})), "nested deeper"));
  }
  SECTION("a NUL byte ends nothing: the JSON must fill the header") {
    // nlohmann's lexer stops at NUL, so "{...}\0junk" would otherwise parse.
    std::string h = "{" + kA + "}" + std::string(1, '\0') + "junk";
    CHECK(contains(parse_error(raw_safetensors(h, d4)), "NUL byte at offset " + std::to_string(kA.size() + 2)));
  }
  SECTION("-0 is not an unsigned integer (the official reader refuses it)") {
    CHECK(contains(parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})", {})),
                   "shape entry 0 is not a non-negative integer"));
    CHECK(contains(parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}})", {})),
                   "are not non-negative integers"));
  }
}

TEST_CASE("safetensors headers the official reader accepts: null metadata, deep unknown fields", "[checkpoint]") {
  const std::vector<uint8_t> d4 = {0, 0x3c, 0, 0x40};
  auto b = raw_safetensors(R"({"__metadata__":null,)" + kA + "}", d4);
  auto h = parse_safetensors_header(b.data(), b.size(), b.size(), "f");
  CHECK(h.metadata.empty());
  CHECK(h.tensors.size() == 1);
  // An unknown field of a tensor entry, nested 100 deep (serde_json's limit is 128).
  const std::string deep = std::string(100, '[') + "1" + std::string(100, ']');
  auto b2 = raw_safetensors(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4],"x":)" + deep + "}}", d4);
  auto h2 = parse_safetensors_header(b2.data(), b2.size(), b2.size(), "f");
  REQUIRE(h2.tensors.size() == 1);
  CHECK(h2.tensors[0].shape == std::vector<int64_t>{2});
}

TEST_CASE("SafetensorsFile maps, finds and views tensors, truncation on disk is reported") {
  TempDir tmp("st");
  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  write_checkpoint(tmp.path / "m", {typed("x.w", DType::F32, {3}, f), typed<uint16_t>("x.h", DType::F16, {2}, {0x3c00, 0x4000})});
  auto file = SafetensorsFile::open(tmp.path / "m" / "model.safetensors");
  REQUIRE(file.tensors().size() == 2);
  const TensorInfo* w = file.find("x.w");
  REQUIRE(w != nullptr);
  CHECK(file.find("nope") == nullptr);
  auto v = file.view<float>(*w);
  REQUIRE(v.size() == 3);
  CHECK(v[0] == 1.5f);
  CHECK(v[2] == 3.25f);
  REQUIRE_THROWS_AS(file.view<uint16_t>(*w), Error);  // element size mismatch
  auto h = to_float(file.data(*file.find("x.h")), DType::F16);
  CHECK(h == std::vector<float>{1.0f, 2.0f});
  CHECK(file.metadata().at("format") == "pt");

  // Moving keeps the mapping valid.
  SafetensorsFile moved = std::move(file);
  CHECK(moved.view<float>(*moved.find("x.w"))[1] == -2.0f);

  // Cut the file inside the data: the last tensor now runs past the end.
  auto bytes = read_bytes(tmp.path / "m" / "model.safetensors");
  bytes.resize(bytes.size() - 2);
  write_bytes(tmp.path / "cut.safetensors", bytes);
  try {
    SafetensorsFile::open(tmp.path / "cut.safetensors");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadData);
    CHECK(contains(e.what(), "cut.safetensors: x.h: data_offsets"));
  }
  write_bytes(tmp.path / "tiny.safetensors", {1, 2});
  REQUIRE_THROWS_WITH(SafetensorsFile::open(tmp.path / "tiny.safetensors"), Catch::Contains("truncated file"));
  REQUIRE_THROWS_AS(SafetensorsFile::open(tmp.path / "missing.safetensors"), Error);
}

TEST_CASE("every ../shared safetensors file reads and its tensors tile the file") {
  MARLINC_REQUIRE_SHARED();
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& dir : {shared_dir() / "golden", shared_dir() / "data"}) {
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.path().extension() != ".safetensors") continue;
      auto f = SafetensorsFile::open(e.path());
      ++files;
      uint64_t total = 0;
      for (const auto& t : f.tensors()) {
        CHECK(uint64_t(t.numel()) * dtype_size(t.dtype) == t.nbytes());
        total += t.nbytes();
      }
      CHECK(f.data_start() + total == f.file_size());
      CHECK(f.data_start() % 8 == 0);
    }
  }
  CHECK(files >= 10);
}

TEST_CASE("golden Marlin files: shapes agree with their metadata and q round-trips through data()") {
  MARLINC_REQUIRE_SHARED();
  auto f = SafetensorsFile::open(shared_dir() / "golden" / "marlin_k512_n768_g128.safetensors");
  const int64_t k = std::stoll(f.metadata().at("k")), n = std::stoll(f.metadata().at("n"));
  CHECK(k == 512);
  CHECK(n == 768);
  const TensorInfo* B = f.find("B");
  REQUIRE(B != nullptr);
  CHECK(B->dtype == DType::I32);
  CHECK(B->shape == std::vector<int64_t>{k / 16, 2 * n});
  const TensorInfo* q = f.find("q");
  REQUIRE(q != nullptr);
  auto qv = f.view<int8_t>(*q);
  for (int8_t c : qv) REQUIRE((c >= -8 && c <= 7));
}

TEST_CASE("Checkpoint opens the shared model directories and single files") {
  MARLINC_REQUIRE_SHARED();
  auto ck = Checkpoint::open(shared_dir() / "data" / "stories260K");
  CHECK(ck.files().size() == 1);
  CHECK(ck.files()[0].path().filename() == "model.safetensors");
  CHECK(ck.config().at("hidden_size") == 64);
  CHECK(ck.quantize_config().empty());
  CHECK(std::is_sorted(ck.tensor_names().begin(), ck.tensor_names().end()));
  auto emb = ck.at("model.embed_tokens.weight");
  CHECK(emb.info->shape == std::vector<int64_t>{512, 64});
  CHECK(ck.data("model.embed_tokens.weight").size() == 512 * 64 * 4);
  REQUIRE_THROWS_WITH(ck.at("model.nope"), Catch::Contains("model.nope: no such tensor"));

  auto fp16 = Checkpoint::open(shared_dir() / "data" / "stories260K-fp16");
  REQUIRE(fp16.tensor_names() == ck.tensor_names());
  // fp16 model = fp32 model rounded: every element within fp16 half-ulp of the fp32 value.
  auto a = to_float(ck.data("model.norm.weight"), DType::F32);
  auto b = to_float(fp16.data("model.norm.weight"), DType::F16);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= std::fabs(a[i]) * (1.0f / 2048) + 1e-7f);

  auto single = Checkpoint::open(shared_dir() / "data" / "stories260K" / "golden-forward.safetensors");
  CHECK(single.files().size() == 1);
  CHECK(single.contains("seq0.logits"));
}
