// bench_convert: `convert --to marlin` on a synthetic GPTQ checkpoint with Llama-3-8B layer shapes
// (hidden 4096, MLP 14336, 8 KV heads -> k/v n = 1024, vocab 128256, 32 blocks, 4-bit, group 128;
// about 5.7 GB), timed against a plain copy (read + write + fsync) of the same files in the same run.
// Target (issue 3): conversion <= 1.5x the copy time on 2 cores.
//
//   bench_convert [--dir D] [--blocks N] [--reps R] [--json FILE] [--keep]
//
// The data lives in D (default ./bench_convert_tmp) and is deleted at the end unless --keep.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "packer/formats/convert.h"

namespace fs = std::filesystem;
using namespace marlinc;

namespace {

struct Lin {
  const char* name;
  int64_t k, n;
};
constexpr int64_t kHidden = 4096, kMlp = 14336, kKv = 1024, kVocab = 128256, kGroup = 128;
const Lin kBlock[] = {{"self_attn.q_proj", kHidden, kHidden}, {"self_attn.k_proj", kHidden, kKv},
                      {"self_attn.v_proj", kHidden, kKv},     {"self_attn.o_proj", kHidden, kHidden},
                      {"mlp.gate_proj", kHidden, kMlp},       {"mlp.up_proj", kHidden, kMlp},
                      {"mlp.down_proj", kMlp, kHidden}};

// xorshift64*: fast deterministic filler (the bench measures layout work, not data quality).
struct Fill {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
};

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> random_words(size_t count, Fill& f) {
  std::vector<uint8_t> b(count * 4);
  for (size_t i = 0; i < count; i += 2) {
    uint64_t x = f.next();
    std::memcpy(b.data() + 4 * i, &x, std::min<size_t>(8, 4 * (count - i)));
  }
  return b;
}

std::vector<uint8_t> random_halves(size_t count, Fill& f, float lo, float hi) {
  std::vector<uint16_t> h(count);
  for (auto& x : h) x = float_to_half(lo + (hi - lo) * float(f.next() >> 40) / float(1ull << 24));
  return bytes_of(h);
}

void synthesize(const fs::path& dir, int blocks) {
  std::vector<TensorSpec> plan;
  plan.push_back({"model.embed_tokens.weight", DType::F16, {kVocab, kHidden}});
  plan.push_back({"model.norm.weight", DType::F16, {kHidden}});
  plan.push_back({"lm_head.weight", DType::F16, {kVocab, kHidden}});
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "model.layers." + std::to_string(b) + ".";
    plan.push_back({p + "input_layernorm.weight", DType::F16, {kHidden}});
    plan.push_back({p + "post_attention_layernorm.weight", DType::F16, {kHidden}});
    for (const Lin& l : kBlock) {
      plan.push_back({p + l.name + ".qweight", DType::I32, {l.k / 8, l.n}});
      plan.push_back({p + l.name + ".qzeros", DType::I32, {l.k / kGroup, l.n / 8}});
      plan.push_back({p + l.name + ".scales", DType::F16, {l.k / kGroup, l.n}});
      plan.push_back({p + l.name + ".g_idx", DType::I32, {l.k}});
    }
  }
  CheckpointWriter w(dir, plan, WriterOptions{5'000'000'000ull, "model", true});
  Fill f{0x9e3779b97f4a7c15ull};
  for (const auto& t : plan) {
    size_t count = 1;
    for (int64_t d : t.shape) count *= size_t(d);
    const std::string& n = t.name;
    if (n.ends_with(".qweight")) {
      w.write(n, random_words(count, f));  // any int32 is 8 valid 4-bit codes
    } else if (n.ends_with(".qzeros")) {
      w.write(n, bytes_of(std::vector<int32_t>(count, 0x77777777)));  // symmetric v1
    } else if (n.ends_with(".g_idx")) {
      std::vector<int32_t> g(count);
      for (size_t r = 0; r < count; ++r) g[r] = int32_t(r / kGroup);
      w.write(n, bytes_of(g));
    } else if (n.ends_with(".scales")) {
      w.write(n, random_halves(count, f, 0.002f, 0.05f));
    } else {
      w.write(n, random_halves(count, f, -0.05f, 0.05f));
    }
  }
  nlohmann::json qc = {{"bits", 4}, {"group_size", kGroup}, {"desc_act", false}, {"sym", true},
                       {"quant_method", "gptq"}, {"checkpoint_format", "gptq"}};
  w.add_file("quantize_config.json", qc.dump(2));
  w.add_file("config.json", nlohmann::json({{"model_type", "llama"}, {"quantization_config", qc}}).dump(2));
  w.add_file("tokenizer_config.json", "{}");
  w.commit();
}

// Plain copy of every file: read, write, fsync (the writer fsyncs its output too).
uint64_t copy_dir(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  std::vector<char> buf(8 << 20);
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    int in = ::open(e.path().c_str(), O_RDONLY);
    int out = ::open((dst / e.path().filename()).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0) throw std::runtime_error("copy: cannot open " + e.path().string());
    ssize_t r;
    while ((r = ::read(in, buf.data(), buf.size())) > 0) {
      ssize_t off = 0;
      while (off < r) {
        ssize_t wr = ::write(out, buf.data() + off, size_t(r - off));
        if (wr <= 0) throw std::runtime_error("copy: write failed");
        off += wr;
      }
      total += uint64_t(r);
    }
    ::fsync(out);
    ::close(in);
    ::close(out);
  }
  return total;
}

uint64_t dir_bytes(const fs::path& d) {
  uint64_t b = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file()) b += e.file_size();
  return b;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = "bench_convert_tmp";
  int blocks = 32, reps = 2;
  bool keep = false;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--blocks" && i + 1 < argc) blocks = std::stoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--keep") keep = true;
    else {
      std::fprintf(stderr, "usage: bench_convert [--dir D] [--blocks N] [--reps R] [--json FILE] [--keep]\n");
      return 2;
    }
  }
  const fs::path src = dir / "src", cp = dir / "copy", out = dir / "marlin";
  try {
    fs::remove_all(cp);
    fs::remove_all(out);
    double t0 = now();
    if (!fs::exists(src / "model.safetensors.index.json") && !fs::exists(src / "model.safetensors")) synthesize(src, blocks);
    const double t_syn = now() - t0;
    const uint64_t bytes = dir_bytes(src);
    std::printf("bench_convert: %d Llama-3-8B blocks, GPTQ 4-bit g128, %.2f GB in %s (synthesized in %.1f s)\n", blocks,
                double(bytes) / 1e9, src.c_str(), t_syn);
    std::vector<double> tc, tv;
    for (int r = 0; r < reps; ++r) {
      fs::remove_all(cp);
      fs::remove_all(out);
      ::sync();
      t0 = now();
      copy_dir(src, cp);
      tc.push_back(now() - t0);
      fs::remove_all(cp);
      fs::remove_all(out);  // both timed runs start without a destination
      ::sync();
      ConvertOptions o;
      o.to = TargetFormat::Marlin;
      o.overwrite = true;
      t0 = now();
      ConvertReport rep = convert_checkpoint(src, out, o);
      tv.push_back(now() - t0);
      if (!rep.ok) throw std::runtime_error("conversion refused the synthetic checkpoint");
      std::printf("  rep %d: copy %.2f s, convert %.2f s\n", r + 1, tc.back(), tv.back());
    }
    const double c = *std::min_element(tc.begin(), tc.end()), v = *std::min_element(tv.begin(), tv.end());
    std::printf("\n| operation | bytes | best of %d (s) | GB/s |\n|---|---|---|---|\n", reps);
    std::printf("| plain copy (read+write+fsync) | %.2f GB | %.2f | %.2f |\n", double(bytes) / 1e9, c, double(bytes) / 1e9 / c);
    std::printf("| convert --to marlin | %.2f GB | %.2f | %.2f |\n", double(bytes) / 1e9, v, double(bytes) / 1e9 / v);
    std::printf("ratio convert/copy = %.2f (target <= 1.5)\n", v / c);
    if (!json_out.empty()) {
      nlohmann::json j = {{"bench", "convert"}, {"blocks", blocks}, {"bytes", bytes}, {"copy_s", tc},
                          {"convert_s", tv}, {"ratio", v / c}};
      std::ofstream(json_out) << j.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_convert: %s\n", e.what());
    if (!keep) fs::remove_all(dir);
    return 1;
  }
  if (!keep) fs::remove_all(dir);
  return 0;
}
