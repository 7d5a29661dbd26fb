// Uses the installed headers and the compiled kernels: parses a GGUF file made in memory and dequantizes
// its one tensor, then (given a model folder) composes a paged engine and generates with it, so
// infer::infer (headers, nlohmann_json, PCRE2, xxHash) and infer::kernels (OpenBLAS) must all link.
#include <infer/infer.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  std::vector<std::byte> file;
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    file.insert(file.end(), b, b + n);
  };
  auto u32 = [&](std::uint32_t v) { put(&v, 4); };
  auto u64 = [&](std::uint64_t v) { put(&v, 8); };
  auto str = [&](const char* s) { u64(std::strlen(s)); put(s, std::strlen(s)); };
  put("GGUF", 4); u32(3); u64(1); u64(1);                    // header: 1 tensor, 1 metadata key
  str("general.architecture"); u32(8); str("llama");        // string value
  str("w"); u32(1); u64(4); u32(1); u64(0);                 // tensor w: 1 dim of 4, f16, offset 0
  while (file.size() % 32) file.push_back(std::byte{0});    // default alignment
  for (float f : {1.0f, -2.0f, 0.5f, 8.0f}) { std::uint16_t h = infer::f32_to_f16(f); put(&h, 2); }

  const auto gguf = infer::gguf::File::from_bytes(file);
  const auto values = gguf.dequantize(gguf.tensor("w"));
  const bool ok = gguf.architecture() == "llama" && values == std::vector<float>{1.0f, -2.0f, 0.5f, 8.0f};
  std::printf("consumer: infer %s, architecture %s, dequantized %zu values: %s\n", INFER_VERSION,
              std::string(gguf.architecture()).c_str(), values.size(), ok ? "ok" : "WRONG");
  if (!ok || argc < 2) return ok ? 0 : 1;

  infer::PagedEngine<infer::cpu, 16> engine(argv[1], infer::EngineOptions{});
  infer::SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 5;
  engine.add_request(std::vector<std::int32_t>{1, 2, 3}, params);
  const auto out = engine.run_to_completion();
  const bool generated = out.size() == 1 && out[0].outputs[0].token_ids.size() == 5;
  std::printf("consumer: PagedEngine generated %zu tokens: %s\n", out.empty() ? 0 : out[0].outputs[0].token_ids.size(),
              generated ? "ok" : "WRONG");
  return generated ? 0 : 1;
}
