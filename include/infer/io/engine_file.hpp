#pragma once
/// \file
/// The engine file: a model built ahead for one engine (TensorRT-LLM's "engine"), written by `infer-build`
/// and loaded by every program's `--engine-file`. It holds what the engine was built for and the weights
/// already in the Quantizer's runtime layout, so loading is a copy of bytes, with no conversion and no
/// quantization:
///
///   offset 0    "INFERENG"                      8 bytes, the magic
///          8    format version                  u32 little-endian (kEngineFileVersion)
///         12    0                               u32, reserved
///         16    header length H                 u64
///         24    FNV-1a 64 of the header         u64
///         32    header                          H bytes of JSON (EngineFileInfo, the tokenizer, the part table)
///         D     parts                           D = the header's "data_offset" (a multiple of 4096); each
///                                               part starts at a multiple of 4096 from D
///
/// A *part* is one array of a loaded weight, named `<role>.<member>` ("blk.3.attn_q.scale"), with its
/// element type ("f32", "i8", "u8", "i32") and byte count; scalars a layout needs (a group size) are in the
/// header. Parts are aligned to 4096 bytes so that a loader can read them straight into device memory.
///
/// Refusals, each a typed error naming what differs: not an engine file (FormatError), another format
/// version (UnsupportedError: both versions), a header whose checksum fails or that is not the JSON this
/// version writes (FormatError), a file shorter than its header says (FormatError: "truncated", both
/// sizes), a part that lies outside the data or does not match its type. What the file was built for
/// (library version, backend, GPU architecture, quantizer) is checked by whoever loads it
/// (engine/engine_file_build.hpp), which knows what it runs on. The weights' bytes carry no checksum
/// (reading 8 GB twice would double the cold start); truncation is caught by the size check.
///
/// The implementation is compiled (kernels/cpu/engine_file.cpp), so the JSON library stays out of the
/// translation units that load models.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/engine/engine_options.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/tensor_parallel.hpp"
#include "infer/tokenizer/spec.hpp"

namespace infer {

/// The format this library writes and reads.
/// 2: the CPU quantizers' linears list a `dense` part (the LM head kept out of INT8, FP8 and INT4).
/// 3: GgufInPlace's embedding and LM head are linears in their GGUF blocks (type, sizes, data), and stacked
///    projections may be parts of different block types.
/// 4: the header says which rank of a tensor-parallel split the file holds ("tensor_parallel": [rank, size]);
///    a file of version 3 holds the whole model and is still read.
inline constexpr std::uint32_t kEngineFileVersion = 4;
/// The oldest format version this library reads.
inline constexpr std::uint32_t kOldestEngineFileVersion = 3;

/// What an engine file was built for, and from what.
struct EngineFileInfo {
  std::uint32_t format_version = kEngineFileVersion;
  std::string library_version;   ///< INFER_VERSION of the build that wrote it
  std::string backend;           ///< "cpu" or "cuda"
  std::string architecture;      ///< "cpu" (little-endian host) or the GPU's "sm_90"
  std::string engine;            ///< "paged" or "static"
  std::int32_t block_size = 16;  ///< paged engine: tokens per KV block
  std::string quantizer;         ///< the LlmOptions name ("auto", "int8", "fp8", "int4", "bf16")
  std::string quantizer_layout;  ///< the Quantizer's own name (Q::name, e.g. "int8-weight-only"): the parts' layout
  EngineOptions engine_options;  ///< limits and the static shape it was built with (kv_cache_bytes, max_model_len,
                                 ///< prefix caching, gpu_memory_utilization, static_shape, scheduler)
  ModelConfig config;
  std::string model;             ///< the model it was built from (ModelSource::describe)
  std::string model_name;        ///< the name clients see (ModelSpec::name of the source)
  /// GEMM algorithm picks measured at build (cuda: kernels::cuda::Gemm::measured_algorithms, bucket key →
  /// cuBLASLt algorithm bytes, with the cuBLASLt version), which the loaded model's GEMMs take instead of
  /// timing candidates on its first steps. Empty on the CPU, whose GEMM has no algorithms to pick.
  std::map<std::string, std::string> gemm_algorithms;
  std::map<std::string, std::int64_t> scalars;  ///< `<role>.<member>` scalars of the weights' layout
  /// The FP8 KV-cache scales the model shipped, {K, V} per layer (ModelSource::kv_cache_scales); empty when it
  /// shipped none. Absent from the header of a file built before they were recorded: read as empty.
  std::vector<std::pair<float, float>> kv_cache_scales;
  /// The part of the model the file holds: {0, 1}, the whole; else one rank's shard (ModelSource::shard), whose
  /// `config` has that rank's heads and MLP width and whose embedding and head hold its block of the vocabulary.
  /// Only that rank of a job of `size` ranks loads it (tensor_parallel_engine_path names the ranks' files).
  TensorParallel tensor_parallel;
};

/// The file of rank `place.rank` among the files `infer-build --tensor-parallel-size N --output file` writes:
/// `file` itself for the whole model (size 1), else `<stem>.tp<N>-rank<r><extension>` beside it
/// ("llama.engine" -> "llama.tp2-rank0.engine", "llama.tp2-rank1.engine"), as TensorRT-LLM writes one engine
/// per rank. Every program's --engine-file takes `file` and loads its rank's.
[[nodiscard]] inline std::filesystem::path tensor_parallel_engine_path(const std::filesystem::path& file,
                                                                       TensorParallel place) {
  if (!place.split()) return file;
  std::filesystem::path out = file;
  out.replace_filename(file.stem().string() + ".tp" + std::to_string(place.size) + "-rank" + std::to_string(place.rank) +
                       file.extension().string());
  return out;
}

/// One array of the weights, as the file's table lists it.
struct EngineFilePart {
  std::string name;
  std::string dtype;          ///< "f32", "i8", "u8", "i32" (element_type_name)
  std::uint64_t offset = 0;   ///< from the data section's start
  std::uint64_t bytes = 0;
};

/// The element type names parts use.
template <class T>
constexpr std::string_view element_type_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, std::int8_t>) return "i8";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "u8";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "i32";
  else if constexpr (std::is_same_v<T, std::uint16_t>) return "u16";
  else static_assert(sizeof(T) == 0, "infer engine file: parts are arrays of f32, i8, u8, i32 or u16");
}

/// An engine file opened for loading: the header checked, the parts mapped.
class EngineFile {
 public:
  /// Errors as the file comment says, each naming `path`. IoError when it cannot be read.
  static EngineFile open(const std::filesystem::path& path);

  /// Whether `path` starts with the engine file magic (false when it cannot be read).
  static bool is_engine_file(const std::filesystem::path& path);

  EngineFile(EngineFile&&) noexcept;
  EngineFile& operator=(EngineFile&&) noexcept;
  ~EngineFile();

  [[nodiscard]] const EngineFileInfo& info() const noexcept;
  /// The tokenizer it was built with (nullopt: the model had none).
  [[nodiscard]] const std::optional<TokenizerSpec>& tokenizer() const noexcept;
  [[nodiscard]] const std::vector<EngineFilePart>& parts() const noexcept;
  [[nodiscard]] const std::filesystem::path& path() const noexcept;

  /// The bytes of part `name`, checked to be of element type `dtype`. FormatError naming the part when it
  /// is absent or of another type.
  [[nodiscard]] std::span<const std::byte> part(std::string_view name, std::string_view dtype) const;
  /// A scalar of the weights' layout; FormatError when absent.
  [[nodiscard]] std::int64_t scalar(std::string_view name) const;
  /// FormatError naming the file unless its weights are in the layout of the Quantizer named `layout`
  /// (Q::name); the message says which --quantizer loads the file instead. What every loader checks first.
  void require_quantizer_layout(std::string_view layout) const;

 private:
  struct Impl;
  explicit EngineFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Collects parts, then writes the file in one pass. The parts' bytes are borrowed: they must stay valid
/// until write() returns (they are the loaded model's own arrays).
class EngineFileWriter {
 public:
  void add_part(std::string name, std::string_view dtype, std::span<const std::byte> bytes);
  void add_scalar(std::string name, std::int64_t value);

  /// Writes `info`, `tokenizer`, the table and every part to `path` (through a temporary file in the same
  /// folder, renamed at the end, so a reader never sees half a file). InvalidArgument for a part name
  /// given twice; IoError naming the path when writing fails. Returns the bytes written.
  std::uint64_t write(const std::filesystem::path& path, EngineFileInfo info,
                      const std::optional<TokenizerSpec>& tokenizer) const;

  [[nodiscard]] std::size_t parts() const noexcept { return parts_.size(); }

 private:
  struct Pending {
    std::string name;
    std::string dtype;
    std::span<const std::byte> bytes;
  };
  std::vector<Pending> parts_;
  std::map<std::string, std::int64_t> scalars_;
};

/// Part visitors for a weight's `visit_parts(self, visitor)`: a linear layer (or any weight) lists its
/// arrays (`v("q", q)`) and its scalars (`v("group_size", group_size)`). Saving borrows the arrays;
/// restoring resizes them and copies the file's bytes in.
struct EnginePartSaver {
  EngineFileWriter& writer;
  std::string prefix;  ///< "<role>."

  template <class T>
  void operator()(std::string_view member, const std::vector<T>& v) const {
    writer.add_part(prefix + std::string(member), element_type_name<T>(), std::as_bytes(std::span<const T>(v)));
  }
  void operator()(std::string_view member, const std::int64_t& v) const {
    writer.add_scalar(prefix + std::string(member), v);
  }
};

struct EnginePartLoader {
  const EngineFile& file;
  std::string prefix;

  template <class T>
  void operator()(std::string_view member, std::vector<T>& v) const {
    const std::string name = prefix + std::string(member);
    const auto bytes = file.part(name, element_type_name<T>());
    if (bytes.size() % sizeof(T) != 0)
      throw FormatError(detail::cat("engine file '", file.path().string(), "': part '", name, "' holds ", bytes.size(),
                                    " bytes, not a whole number of ", element_type_name<T>(), " values"));
    v.resize(bytes.size() / sizeof(T));
    if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  }
  void operator()(std::string_view member, std::int64_t& v) const { v = file.scalar(prefix + std::string(member)); }
};

/// Arena visitors, for a backend whose weights all live in one device arena (cuda): the arena is one part,
/// read straight into device memory, and a weight lists its pointers into it (`v.pointer("data", p, bytes)`,
/// saved as the scalar `<role>.data.offset`, -1 for none) and its sizes (`v.scalar("out", out)`). A weight
/// lists its scalars before its pointers, so a loader knows the bytes a pointer must have.
struct EngineArenaSaver {
  EngineFileWriter& writer;
  const void* base;    ///< the arena's first byte (device)
  std::string prefix;  ///< "<role>."

  [[nodiscard]] EngineArenaSaver at(std::string_view role) const { return {writer, base, prefix + std::string(role) + "."}; }
  template <class T>
    requires std::is_integral_v<T> || std::is_enum_v<T>
  void scalar(std::string_view member, const T& v) const {
    writer.add_scalar(prefix + std::string(member), static_cast<std::int64_t>(v));
  }
  template <class T>
  void pointer(std::string_view member, const T* const& p, std::size_t /*bytes*/) const {
    const auto offset = p == nullptr ? std::int64_t{-1}
                                     : static_cast<std::int64_t>(reinterpret_cast<const std::byte*>(p) -
                                                                 static_cast<const std::byte*>(base));
    writer.add_scalar(prefix + std::string(member) + ".offset", offset);
  }
};

struct EngineArenaLoader {
  const EngineFile& file;
  const void* base;          ///< the arena the part "arena" was copied into (device), or any base for a checking pass
  std::uint64_t arena_bytes;
  std::string prefix;

  [[nodiscard]] EngineArenaLoader at(std::string_view role) const {
    return {file, base, arena_bytes, prefix + std::string(role) + "."};
  }
  template <class T>
    requires std::is_integral_v<T> || std::is_enum_v<T>
  void scalar(std::string_view member, T& v) const {
    const std::int64_t x = file.scalar(prefix + std::string(member));
    if constexpr (std::is_integral_v<T>)
      if (!std::in_range<T>(x))
        throw FormatError(detail::cat("engine file '", file.path().string(), "': scalar '", prefix, member, "' is ", x,
                                      ", out of its type's range"));
    v = static_cast<T>(x);
  }
  /// FormatError naming the pointer when its `bytes` would not lie inside the arena.
  template <class T>
  void pointer(std::string_view member, const T*& p, std::size_t bytes) const {
    const std::string name = prefix + std::string(member) + ".offset";
    const std::int64_t offset = file.scalar(name);
    if (offset == -1 && bytes == 0) {
      p = nullptr;
      return;
    }
    if (offset < 0 || static_cast<std::uint64_t>(offset) > arena_bytes || bytes > arena_bytes - offset)
      throw FormatError(detail::cat("engine file '", file.path().string(), "': '", name, "' is ", offset, " for ", bytes,
                                    " bytes, outside the weight arena of ", arena_bytes, " bytes"));
    // (integer arithmetic: a checking pass places pointers against a base that is not the arena's)
    p = reinterpret_cast<const T*>(reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(offset));
  }
};

/// The architecture an engine file for `backend` is built for on this machine: "cpu" for the cpu backend
/// (a little-endian host), the current GPU's "sm_XY" for cuda; "no cuda device" or "no cuda in this build"
/// where there is none, which no file names, so loading one is refused naming both.
std::string engine_file_architecture(std::string_view backend);

}  // namespace infer
