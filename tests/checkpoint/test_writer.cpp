// CheckpointWriter: byte-exact output (formats.md §7.1 example), determinism, sharding + index,
// atomicity, refusal to clobber; Checkpoint's sharded-index validation.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/writer.h"
#include "tests/checkpoint/st_util.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::test;
namespace fs = std::filesystem;

namespace {
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A deterministic mixed-dtype model: several layers with I32 / F16 / I16 / F32 / U8 tensors.
std::vector<TensorData> sample_tensors() {
  std::vector<TensorData> ts;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.up_proj.";
    ts.push_back(filled(p + "qweight", DType::I32, {16, 64}, 1 + l));
    ts.push_back(filled(p + "scales", DType::F16, {1, 64}, 10 + l));
    ts.push_back(filled(p + "B_meta", DType::I16, {2, 40}, 20 + l));
    ts.push_back(filled(p + "norm", DType::F32, {7}, 30 + l));
    ts.push_back(filled(p + "mask", DType::U8, {3, 5}, 40 + l));
  }
  ts.push_back(filled("lm_head.weight", DType::BF16, {9, 8}, 99));
  ts.push_back(filled("empty", DType::F64, {0, 4}, 98));
  return ts;
}
}  // namespace

TEST_CASE("writer reproduces the formats.md 7.1 byte example exactly") {
  TempDir tmp("w71");
  write_checkpoint(tmp.path / "out", {typed<uint16_t>("a", DType::F16, {2}, {0x3c00, 0x4000})});
  auto b = read_bytes(tmp.path / "out" / "model.safetensors");
  const std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  REQUIRE(header.size() == 85);
  std::vector<uint8_t> expect = {0x58, 0, 0, 0, 0, 0, 0, 0};
  expect.insert(expect.end(), header.begin(), header.end());
  expect.insert(expect.end(), {' ', ' ', ' ', 0x00, 0x3c, 0x00, 0x40});
  REQUIRE(expect.size() == 100);
  CHECK(b == expect);
}

TEST_CASE("single-file round trip: order by alignment then name, every byte back, aligned offsets") {
  TempDir tmp("w1");
  auto ts = sample_tensors();
  write_checkpoint(tmp.path / "m", ts, {{"config.json", R"({"model_type":"llama"})"}});
  CHECK(!fs::exists(tmp.path / "m" / "model.safetensors.index.json"));
  auto ck = Checkpoint::open(tmp.path / "m");
  CHECK(ck.config().at("model_type") == "llama");
  REQUIRE(ck.tensor_names().size() == ts.size());
  for (const auto& t : ts) {
    auto r = ck.at(t.spec.name);
    CHECK(r.info->dtype == t.spec.dtype);
    CHECK(r.info->shape == t.spec.shape);
    auto d = ck.data(t.spec.name);
    CHECK(std::vector<uint8_t>(d.begin(), d.end()) == t.bytes);
    CHECK((r.file->data_start() + r.info->begin) % dtype_size(t.spec.dtype) == 0);
  }
  // Header order: alignment descending, then name.
  const auto& order = ck.files()[0].tensors();
  for (size_t i = 1; i < order.size(); ++i) {
    const size_t a = dtype_size(order[i - 1].dtype), b = dtype_size(order[i].dtype);
    CHECK((a > b || (a == b && order[i - 1].name < order[i].name)));
  }
  CHECK(ck.files()[0].data_start() % 8 == 0);
  // No temporary directory left beside the output.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) { (void)e; ++entries; }
  CHECK(entries == 1);
}

TEST_CASE("writer output is byte-identical across runs and write orders") {
  TempDir tmp("wdet");
  auto ts = sample_tensors();
  WriterOptions o;
  o.max_shard_bytes = 3000;
  write_checkpoint(tmp.path / "a", ts, {}, o);
  // Second run writes in forward order.
  {
    std::vector<TensorSpec> plan;
    for (const auto& t : ts) plan.push_back(t.spec);
    CheckpointWriter w(tmp.path / "b", plan, o);
    for (const auto& t : ts) w.write(t.spec.name, t.bytes);
    w.commit();
  }
  std::vector<std::string> names_a, names_b;
  for (const auto& e : fs::directory_iterator(tmp.path / "a")) names_a.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(tmp.path / "b")) names_b.push_back(e.path().filename().string());
  std::sort(names_a.begin(), names_a.end());
  std::sort(names_b.begin(), names_b.end());
  REQUIRE(names_a == names_b);
  REQUIRE(names_a.size() > 2);
  for (const auto& n : names_a) CHECK(read_bytes(tmp.path / "a" / n) == read_bytes(tmp.path / "b" / n));
}

TEST_CASE("sharded round trip: shard names, index form, every tensor in exactly one shard") {
  TempDir tmp("wsh");
  auto ts = sample_tensors();
  uint64_t total = 0;
  for (const auto& t : ts) total += t.bytes.size();
  WriterOptions o;
  o.max_shard_bytes = 2500;
  write_checkpoint(tmp.path / "m", ts, {}, o);
  const fs::path idx_path = tmp.path / "m" / "model.safetensors.index.json";
  REQUIRE(fs::exists(idx_path));
  auto idx_text = read_bytes(idx_path);
  std::string text(idx_text.begin(), idx_text.end());
  CHECK(text.back() == '\n');
  CHECK(text.rfind("{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total) + "\n  },\n  \"weight_map\": {\n", 0) == 0);
  auto idx = nlohmann::json::parse(text);
  CHECK(idx["weight_map"].size() == ts.size());
  std::set<std::string> shards;
  for (auto& [k, v] : idx["weight_map"].items()) shards.insert(v.get<std::string>());
  const size_t N = shards.size();
  REQUIRE(N >= 3);
  char want[64];
  std::snprintf(want, sizeof want, "model-00001-of-%05zu.safetensors", N);
  CHECK(*shards.begin() == want);
  auto ck = Checkpoint::open(tmp.path / "m");
  CHECK(ck.sharded());
  CHECK(ck.files().size() == N);
  for (const auto& f : ck.files()) {
    uint64_t bytes = 0;
    for (const auto& t : f.tensors()) bytes += t.nbytes();
    // A shard exceeds the cap only when it holds a single tensor larger than the cap.
    CHECK((bytes <= o.max_shard_bytes || f.tensors().size() == 1));
  }
  for (const auto& t : ts) {
    auto d = ck.data(t.spec.name);
    CHECK(std::vector<uint8_t>(d.begin(), d.end()) == t.bytes);
  }
}

TEST_CASE("writer is atomic and refuses to clobber") {
  TempDir tmp("wat");
  auto ts = sample_tensors();
  std::vector<TensorSpec> plan;
  for (const auto& t : ts) plan.push_back(t.spec);
  SECTION("destructor without commit leaves nothing") {
    {
      CheckpointWriter w(tmp.path / "out", plan);
      w.write(ts[0].spec.name, ts[0].bytes);
      CHECK(fs::exists(w.temp_dir()));
    }
    CHECK(fs::is_empty(tmp.path));
  }
  SECTION("commit with a missing tensor throws and leaves nothing") {
    {
      CheckpointWriter w(tmp.path / "out", plan);
      for (size_t i = 1; i < ts.size(); ++i) w.write(ts[i].spec.name, ts[i].bytes);
      CHECK(contains(error_of([&] { w.commit(); }), ts[0].spec.name + ": planned tensor was never written"));
    }
    CHECK(fs::is_empty(tmp.path));
  }
  SECTION("wrong size, unplanned name and double write are refused") {
    CheckpointWriter w(tmp.path / "out", plan);
    CHECK(contains(error_of([&] { w.write(ts[0].spec.name, std::vector<uint8_t>(3)); }), "got 3 bytes"));
    CHECK(contains(error_of([&] { w.write("nope", ts[0].bytes); }), "nope: tensor was not in the writer's plan"));
    w.write(ts[0].spec.name, ts[0].bytes);
    CHECK(contains(error_of([&] { w.write(ts[0].spec.name, ts[0].bytes); }), "written twice"));
    CHECK(contains(error_of([&] { w.add_file("../evil", "x"); }), "must not contain"));
  }
  SECTION("existing non-empty out_dir is refused unless overwrite") {
    fs::create_directories(tmp.path / "out");
    write_text(tmp.path / "out" / "keep.txt", "old");
    try {
      CheckpointWriter w(tmp.path / "out", plan);
      FAIL("expected refusal");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::BadUsage);
      CHECK(contains(e.what(), "exists and is not empty"));
    }
    CHECK(fs::exists(tmp.path / "out" / "keep.txt"));
    WriterOptions o;
    o.overwrite = true;
    // Not a checkpoint (no *.safetensors): --overwrite refuses to delete it.
    CHECK(contains(error_of([&] { write_checkpoint(tmp.path / "out", ts, {}, o); }), "holds no *.safetensors"));
    CHECK(fs::exists(tmp.path / "out" / "keep.txt"));
    write_text(tmp.path / "out" / "model.safetensors", "an earlier output");
    write_checkpoint(tmp.path / "out", ts, {}, o);
    CHECK(!fs::exists(tmp.path / "out" / "keep.txt"));
    // A replaced output that cannot be removed is moved out of the temporary name (which a later run
    // would call an interrupted run's output) and reported through leftover() and its note.
    {
      WriterOptions keep = o;
      keep.test_keep_replaced = true;
      CheckpointWriter w(tmp.path / "out", plan, keep);
      for (const auto& t : ts) w.write(t.spec.name, t.bytes);
      w.commit();
      REQUIRE(!w.leftover().empty());
      CHECK(w.leftover().filename().string().rfind("out.old-", 0) == 0);
      CHECK(fs::exists(w.leftover() / "keep.txt") == false);
      CHECK(fs::exists(w.leftover() / "model.safetensors"));  // the output it replaced
      CHECK(contains(leftover_note(w), w.leftover().string()));
      CHECK(stale_temp_outputs(tmp.path / "out").empty());
      fs::remove_all(w.leftover());
    }
    CHECK(Checkpoint::open(tmp.path / "out").tensor_names().size() == ts.size());
    int entries = 0;
    for (const auto& e : fs::directory_iterator(tmp.path)) { (void)e; ++entries; }
    CHECK(entries == 1);
  }
  SECTION("an existing empty out_dir is fine") {
    fs::create_directories(tmp.path / "out");
    write_checkpoint(tmp.path / "out", ts);
    CHECK(fs::exists(tmp.path / "out" / "model.safetensors"));
  }
  SECTION("duplicate planned names are refused") {
    auto p2 = plan;
    p2.push_back(plan[0]);
    CHECK(contains(error_of([&] { CheckpointWriter w(tmp.path / "out", p2); }), "planned twice"));
    CHECK(fs::is_empty(tmp.path));
  }
}

TEST_CASE("copy_non_tensor_files copies tokenizer, generation and remote-code files, never weights or configs") {
  TempDir tmp("wcp");
  const fs::path src = tmp.path / "src";
  fs::create_directories(src);
  for (const char* n : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "generation_config.json",
                        "special_tokens_map.json", "chat_template.jinja", "cl100k.tiktoken", "config.json",
                        "quantize_config.json", "model.safetensors", "model.safetensors.index.json", "README.md",
                        "modeling_custom.py", "configuration_custom.py"})
    write_text(src / n, std::string("content of ") + n);
  std::vector<std::string> copied;
  {
    CheckpointWriter w(tmp.path / "out", {{"x", DType::U8, {1}}});
    w.write("x", std::vector<uint8_t>{7});
    copied = copy_non_tensor_files(src, w);
    w.commit();
  }
  const std::vector<std::string> want = {"chat_template.jinja",     "cl100k.tiktoken",        "configuration_custom.py",
                                         "generation_config.json",  "modeling_custom.py",     "special_tokens_map.json",
                                         "tokenizer.json",          "tokenizer.model",        "tokenizer_config.json"};
  CHECK(copied == want);
  for (const auto& n : want) {
    auto b = read_bytes(tmp.path / "out" / n);
    CHECK(std::string(b.begin(), b.end()) == "content of " + n);
  }
  CHECK(!fs::exists(tmp.path / "out" / "config.json"));
  CHECK(!fs::exists(tmp.path / "out" / "README.md"));
  CHECK(!fs::exists(tmp.path / "out" / "quantize_config.json"));
}

TEST_CASE("sharded checkpoints: index errors are named") {
  TempDir tmp("idx");
  auto ts = sample_tensors();
  WriterOptions o;
  o.max_shard_bytes = 2500;
  write_checkpoint(tmp.path / "m", ts, {}, o);
  const fs::path dir = tmp.path / "m", idx_path = dir / "model.safetensors.index.json";
  const auto idx_bytes = read_bytes(idx_path);
  auto idx = nlohmann::json::parse(std::string(idx_bytes.begin(), idx_bytes.end()));
  const std::string victim = "model.layers.1.mlp.up_proj.qweight";
  const std::string shard = idx["weight_map"][victim];
  auto rewrite = [&](const nlohmann::json& j) { write_text(idx_path, j.dump(2)); };
  SECTION("missing shard") {
    fs::remove(dir / shard);
    auto e = error_of([&] { Checkpoint::open(dir); });
    CHECK(contains(e, ": shard " + shard + " does not exist"));
    CHECK(contains(e, "model.safetensors.index.json"));
  }
  SECTION("index naming a missing tensor") {
    auto j = idx;
    j["weight_map"]["model.ghost"] = shard;
    rewrite(j);
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "model.ghost: index maps it to " + shard + " but that shard has no such tensor"));
  }
  SECTION("tensor missing from the index") {
    auto j = idx;
    j["weight_map"].erase(victim);
    rewrite(j);
    auto e = error_of([&] { Checkpoint::open(dir); });
    CAPTURE(e);
    CHECK(contains(e, shard + ": " + victim + ": tensor is missing from model.safetensors.index.json"));
  }
  SECTION("index mapping a tensor to the wrong shard") {
    auto j = idx;
    std::string other;
    for (auto& [k, v] : idx["weight_map"].items())
      if (v != shard) other = v;
    j["weight_map"][victim] = other;
    rewrite(j);
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), victim + ": index maps it to " + other));
  }
  SECTION("malformed index JSON and duplicate keys") {
    write_text(idx_path, "{\"weight_map\": {");
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "malformed JSON"));
    write_text(idx_path, "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}");
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "a: duplicate key"));
    write_text(idx_path, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "not a plain file name"));
  }
  SECTION("a config file that is a directory is an error, not a missing config") {
    fs::create_directory(dir / "config.json");
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "config.json: not a regular file"));
    fs::remove(dir / "config.json");
    fs::create_symlink(dir / "nowhere.json", dir / "quantize_config.json");
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "quantize_config.json: not a regular file"));
  }
  SECTION("several safetensors files without an index") {
    fs::remove(idx_path);
    CHECK(contains(error_of([&] { Checkpoint::open(dir); }), "no model.safetensors.index.json"));
  }
  SECTION("missing path is a usage error") {
    try {
      Checkpoint::open(tmp.path / "nowhere");
      FAIL("expected an error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::BadUsage);
    }
  }
}

TEST_CASE("quantize_config merges config.json, quant_config.json and quantize_config.json in 4.6 order") {
  TempDir tmp("qc");
  write_checkpoint(tmp.path / "m", {filled("x", DType::U8, {1}, 1)},
                   {{"config.json", R"({"quantization_config":{"quant_method":"gptq","bits":8,"group_size":64,"sym":false}})"},
                    {"quant_config.json", R"({"bits":3,"w_bit":4})"},
                    {"quantize_config.json", R"({"bits":4,"desc_act":true})"}});
  auto ck = Checkpoint::open(tmp.path / "m");
  const auto& q = ck.quantize_config();
  CHECK(q.at("bits") == 4);          // quantize_config.json wins
  CHECK(q.at("w_bit") == 4);         // from quant_config.json
  CHECK(q.at("group_size") == 64);   // only in config.json
  CHECK(q.at("desc_act") == true);
  CHECK(q.at("quant_method") == "gptq");
  CHECK(ck.quantize_config_sources() ==
        std::vector<std::string>{"quantize_config.json", "quant_config.json", "config.json:quantization_config"});
  write_text(tmp.path / "m" / "config.json", "[1]");
  CHECK(contains(error_of([&] { Checkpoint::open(tmp.path / "m"); }), "config.json: top level is array"));
}

TEST_CASE("stale_temp_outputs lists what killed writers left, and nothing a live one owns", "[writer]") {
  TempDir tmp("wstale");
  const fs::path out = tmp.path / "out";
  const std::string mine = std::to_string(::getpid());
  // 99999999999 is above any pid_max: that process cannot be running.
  for (const std::string& n : std::vector<std::string>{"out.tmp-99999999999-0", "out.tmp-" + mine + "-3", "out.tmp-x-1",
                                                       "out.tmp-12-", "other.tmp-99999999999-0", "out.tmp-99999999999-1-2"})
    fs::create_directories(tmp.path / n);
  std::ofstream(tmp.path / "out.tmp-99999999999-7") << "a file, not a directory";
  const auto stale = stale_temp_outputs(out);
  REQUIRE(stale.size() == 1);
  CHECK(stale[0].filename() == "out.tmp-99999999999-0");
  CHECK(stale_temp_outputs(tmp.path / "out/") == stale);  // a trailing slash names the same output
  CHECK(stale_temp_outputs(tmp.path / "missing" / "out").empty());
}

TEST_CASE("on a fatal signal, remove_live_temp_outputs deletes the live writers' temporary outputs only") {
  TempDir tmp("wsig");
  fs::create_directories(tmp.path / "done");
  write_text(tmp.path / "done" / "keep.txt", "a finished output stays");
  CHECK(exit_status_after_sigterm(remove_live_temp_outputs, [&] {
          CheckpointWriter w(tmp.path / "out", {{"x", DType::U8, {4}}, {"y", DType::U8, {4}}});
          w.write("x", std::vector<uint8_t>{1, 2, 3, 4});
          w.add_file("config.json", "{}");
          if (!fs::exists(w.temp_dir() / "model.safetensors")) ::_exit(3);
          ::raise(SIGTERM);  // while the writer lives
        }) == 7);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"done"});
  CHECK(fs::exists(tmp.path / "done" / "keep.txt"));
}

TEST_CASE("on a fatal signal a LiveTempDir's directory goes too and after it ends nothing is registered") {
  TempDir tmp("wlive");
  CHECK(exit_status_after_sigterm(remove_live_temp_outputs, [&] {
          fs::create_directories(tmp.path / "ended");
          { LiveTempDir done(tmp.path / "ended"); }  // unregistered: stays
          fs::create_directories(tmp.path / "job.new");
          write_text(tmp.path / "job.new" / "block-00000.bin", "bytes");
          LiveTempDir live(tmp.path / "job.new");
          ::raise(SIGTERM);
        }) == 7);
  CHECK_FALSE(fs::exists(tmp.path / "job.new"));
  CHECK(fs::is_directory(tmp.path / "ended"));
}

TEST_CASE("a FIFO in place of a shard is refused at once, not waited on") {
  TempDir tmp("wfifo");
  fs::create_directories(tmp.path / "m");
  REQUIRE(::mkfifo((tmp.path / "m" / "model.safetensors").c_str(), 0600) == 0);
  std::string msg;
  try {
    Checkpoint::open(tmp.path / "m");
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("not a regular file") != std::string::npos);
}
