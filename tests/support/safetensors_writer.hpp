#pragma once
/// Writes a safetensors file (8-byte little-endian header size, JSON header, data) for tests that make
/// their own checkpoints: a quantized layout beside the same model in f32, a malformed companion tensor.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace infer::test {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  ///< "F32", "I8", ...
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;

  template <class T>
  static SafetensorsEntry of(std::string name, std::string dtype, std::vector<std::uint64_t> shape,
                             std::span<const T> values) {
    SafetensorsEntry e{std::move(name), std::move(dtype), std::move(shape), std::vector<std::byte>(values.size_bytes())};
    std::memcpy(e.bytes.data(), values.data(), values.size_bytes());
    return e;
  }
};

inline void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t at = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + e.bytes.size()}}};
    at += e.bytes.size();
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');  // data 8-byte aligned, as HF writes it
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& e : entries) f.write(reinterpret_cast<const char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
}

}  // namespace infer::test
