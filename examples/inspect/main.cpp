// infer-inspect MODEL [--json] [--full]
//
// Prints what a model file holds: its format, the architecture and ModelConfig infer derives from it, the
// metadata, and the tensor table (name, type, shape, bytes). MODEL is a .gguf file, a .safetensors file, or
// a Hugging Face model folder (config.json + model.safetensors or a sharded index). With --json the same
// comes out as one JSON document. Long metadata arrays (the vocabulary, merges) are abbreviated unless --full.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "infer/io/gguf.hpp"
#include "infer/io/safetensors.hpp"
#include "infer/model/gguf_config.hpp"
#include "infer/model/hf_config.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Options {
  std::string model;
  bool json = false;
  bool full = false;
};

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} B", b);
}

/// A GGUF value as JSON; arrays longer than `max_items` (0 = no limit) become {count, head}.
json to_json(const infer::gguf::Value& value, std::size_t max_items) {
  return std::visit(
      [&](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, infer::gguf::Array>) {
          json items = json::array();
          const std::size_t n = max_items ? std::min(max_items, x.items.size()) : x.items.size();
          for (std::size_t i = 0; i < n; ++i) items.push_back(to_json(x.items[i], max_items));
          if (n == x.items.size()) return items;
          return json{{"count", x.items.size()}, {"head", items}};
        } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          return static_cast<double>(x);
        } else {
          return x;
        }
      },
      value.v);
}

json config_json(const infer::ModelConfig& c) {
  json j = json::object();
  for (const auto& [k, v] : c.fields()) j[k] = v;
  return j;
}

void print_config(const infer::ModelConfig& c) {
  fmt::print("config:\n");
  for (const auto& [k, v] : c.fields()) fmt::print("  {:<26} {}\n", k, v);
}

int inspect_gguf(const Options& o) {
  const auto file = infer::gguf::File::open(o.model);
  const auto config = infer::from_gguf(file);
  const std::size_t max_items = o.full ? 0 : 8;
  std::uint64_t tensor_bytes = 0;
  for (const auto& t : file.tensors()) tensor_bytes += t.bytes;

  if (o.json) {
    json meta = json::object();
    for (const auto& [k, v] : file.metadata())
      meta[k] = {{"type", std::string(infer::gguf::name(v.type()))}, {"value", to_json(v, max_items)}};
    json tensors = json::array();
    for (const auto& t : file.tensors())
      tensors.push_back({{"name", t.name}, {"type", std::string(infer::name(t.type))}, {"shape", t.shape},
                         {"elements", t.elements()}, {"bytes", t.bytes}, {"offset", t.offset}});
    const json doc{{"file", o.model}, {"format", "gguf"}, {"version", file.version()},
                   {"alignment", file.alignment()}, {"architecture", std::string(file.architecture())},
                   {"config", config_json(config)}, {"metadata", meta}, {"tensor_bytes", tensor_bytes},
                   {"tensors", tensors}};
    fmt::print("{}\n", doc.dump(1));
    return 0;
  }
  fmt::print("file: {} (GGUF v{}, {}, alignment {})\n", o.model, file.version(),
             human_bytes(fs::file_size(o.model)), file.alignment());
  fmt::print("architecture: {}\n", file.architecture());
  print_config(config);
  fmt::print("metadata ({} keys):\n", file.metadata().size());
  for (const auto& [k, v] : file.metadata())
    fmt::print("  {:<40} {:<12} {}\n", k, infer::gguf::name(v.type()), v.to_display(max_items ? max_items : ~0ull));
  fmt::print("tensors ({}, {}; shapes in GGUF order, fastest dimension first):\n", file.tensors().size(),
             human_bytes(tensor_bytes));
  fmt::print("  {:<36} {:<6} {:<16} {:>12}\n", "name", "type", "shape", "bytes");
  for (const auto& t : file.tensors())
    fmt::print("  {:<36} {:<6} {:<16} {:>12}\n", t.name, infer::name(t.type), shape_text(t.shape), t.bytes);
  return 0;
}

int inspect_safetensors(const Options& o) {
  const auto ckpt = infer::safetensors::Checkpoint::open(o.model);
  const fs::path config_path = ckpt.directory() / "config.json";
  std::optional<infer::ModelConfig> config;
  if (fs::exists(config_path)) config = infer::load_hf_config(config_path);
  std::uint64_t tensor_bytes = 0;
  for (const auto& name : ckpt.names()) tensor_bytes += ckpt.at(name).data.size();

  if (o.json) {
    json shards = json::array();
    json meta = json::object();
    for (const auto& s : ckpt.shards()) {
      shards.push_back(s.path());
      for (const auto& [k, v] : s.metadata()) meta[k] = v;
    }
    json tensors = json::array();
    for (const auto& name : ckpt.names()) {
      const auto& t = ckpt.at(name);
      tensors.push_back({{"name", name}, {"type", std::string(infer::name(t.dtype))}, {"shape", t.shape},
                         {"elements", t.elements()}, {"bytes", t.data.size()}, {"file", ckpt.shard_of(name).path()}});
    }
    json doc{{"file", o.model}, {"format", "safetensors"}, {"shards", shards}, {"metadata", meta},
             {"tensor_bytes", tensor_bytes}, {"tensors", tensors}};
    doc["config"] = config ? config_json(*config) : json(nullptr);
    doc["architecture"] = config ? json(config->architecture) : json(nullptr);
    fmt::print("{}\n", doc.dump(1));
    return 0;
  }
  fmt::print("file: {} (safetensors, {} shard{})\n", o.model, ckpt.shards().size(),
             ckpt.shards().size() == 1 ? "" : "s");
  if (config) {
    fmt::print("architecture: {}\n", config->architecture);
    print_config(*config);
  } else {
    fmt::print("config: none ({} not found)\n", config_path.string());
  }
  for (const auto& s : ckpt.shards()) {
    fmt::print("metadata of {} ({} keys):\n", s.path(), s.metadata().size());
    for (const auto& [k, v] : s.metadata()) fmt::print("  {:<40} {}\n", k, v);
  }
  fmt::print("tensors ({}, {}; shapes in row-major order, slowest dimension first):\n", ckpt.size(),
             human_bytes(tensor_bytes));
  fmt::print("  {:<48} {:<5} {:<16} {:>12}\n", "name", "type", "shape", "bytes");
  for (const auto& name : ckpt.names()) {
    const auto& t = ckpt.at(name);
    fmt::print("  {:<48} {:<5} {:<16} {:>12}\n", name, infer::name(t.dtype), shape_text(t.shape), t.data.size());
  }
  return 0;
}

/// A file is GGUF when it starts with the magic; anything else is left to the safetensors reader,
/// whose errors then say what it expected.
bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return fs::is_regular_file(path) && in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Print a model file's architecture, config, metadata and tensor table", "infer-inspect"};
  Options o;
  app.add_option("model", o.model, "a .gguf file, a .safetensors file, or a Hugging Face model folder")->required();
  app.add_flag("--json", o.json, "print one JSON document");
  app.add_flag("--full", o.full, "print long metadata arrays whole");
  CLI11_PARSE(app, argc, argv);
  try {
    return is_gguf(o.model) ? inspect_gguf(o) : inspect_safetensors(o);
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-inspect: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-inspect: error: {}\n", e.what());
    return 1;
  }
}
