// Mixture-of-experts routers (adapters.h): found from the tensor names alone, so RTN, convert and
// inspect need no knowledge of the architecture.
#include <string>

#include "packer/adapters.h"

namespace marlinc {

namespace {

constexpr std::string_view kExperts = ".experts.";

// The part of `prefix` before its last '.', or "" when there is none.
std::string parent_of(const std::string& prefix) {
  const size_t dot = prefix.rfind('.');
  return dot == std::string::npos ? std::string() : prefix.substr(0, dot);
}

std::string leaf_of(const std::string& prefix) {
  const size_t dot = prefix.rfind('.');
  return dot == std::string::npos ? prefix : prefix.substr(dot + 1);
}

}  // namespace

std::set<std::string> moe_expert_parents(const std::vector<std::string>& tensor_names) {
  std::set<std::string> out;
  for (const std::string& name : tensor_names) {
    // Every occurrence: a block of experts nested in another module's experts still names its own parent.
    for (size_t at = name.find(kExperts); at != std::string::npos; at = name.find(kExperts, at + 1))
      if (at > 0) out.insert(name.substr(0, at));
  }
  return out;
}

bool is_moe_router(const std::string& prefix, const std::set<std::string>& expert_parents) {
  const std::string leaf = leaf_of(prefix), parent = parent_of(prefix);
  // Names no dense layer uses: routers whatever their block holds (Llama 4, gpt-oss and Granite-MoE keep
  // their experts as 3-D tensors, not as `experts.N` modules).
  if (leaf == "router" || leaf == "shared_expert_gate") return true;
  if (leaf == "layer" && leaf_of(parent) == "router") return true;  // Granite-MoE, DBRX, JetMoE
  // `gate` alone is a dense MLP's name in some models: a router only beside experts.
  if (leaf == "gate") return expert_parents.count(parent) > 0;
  if (leaf == "wg" && leaf_of(parent) == "gate") return expert_parents.count(parent_of(parent)) > 0;  // Hunyuan
  return false;
}

}  // namespace marlinc
