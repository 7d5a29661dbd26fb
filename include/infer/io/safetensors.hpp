#pragma once
/// \file
/// Reader for the safetensors format (HF checkpoints), single files and sharded checkpoints.
///
/// Layout of a file: an unsigned 64-bit little-endian header length N, then N bytes of UTF-8 JSON,
/// then the data section. The JSON is an object mapping each tensor name to
/// `{"dtype": "F32"|"F16"|"BF16"|..., "shape": [d0, d1, ...], "data_offsets": [begin, end]}`, with
/// offsets relative to the start of the data section, plus an optional `"__metadata__"` object of
/// string → string. Tensors are read in place from the mapping; nothing is copied until `to_f32`.
///
/// Every structural property a later reader would rely on is checked here, once, so that a tensor's
/// span is always inside the file and exactly as long as its shape says: a malformed file throws
/// FormatError naming the file, the tensor and the offending numbers; a well-formed file using a
/// dtype this library does not load (I64, F64, F8_E5M2, ...) throws UnsupportedError. I8, F8_E4M3 and I32
/// load (INT8 and FP8 weights, AWQ/GPTQ packed codes); decoding them needs their scales, which only a
/// Quantizer that loads by role reads.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/io/mapped_file.hpp"

namespace infer::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is read in place; big-endian hosts are not supported");

/// The header is parsed into a DOM before any tensor is touched; a bigger header is not a real
/// checkpoint (the largest public ones have a few MB of header) but a corrupt or hostile length.
inline constexpr std::uint64_t max_header_bytes = 100ull * 1024 * 1024;

/// One tensor of a file: a view into the file's mapping, valid while the owning `File` lives.
struct Tensor {
  std::string name;
  DType dtype = DType::f32;  ///< f32, f16 or bf16: the only dtypes `File` accepts
  /// Row-major in HF/PyTorch order: shape[0] is the slowest-varying (outermost) dimension, so a
  /// Linear weight is [out_features, in_features]. GGUF lists dimensions the other way round
  /// (ne[0] is the fastest), so the same weight there reads [in_features, out_features].
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> data;  ///< exactly elements() * element size bytes
  std::uint64_t begin = 0;          ///< offset of `data` from the start of the data section

  /// Product of the shape (1 for a scalar, whose shape is []). Cannot overflow: checked at open.
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

namespace detail {

using infer::detail::cat;

/// Maps a safetensors dtype string to ours; nullopt for the ones we do not load.
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "I8") return DType::int8;         // INT8 checkpoints' weights, read with their scales (Int8WeightOnly)
  if (s == "F8_E4M3") return DType::fp8_e4m3;  // FP8 checkpoints' weights, read with their scales (Fp8)
  if (s == "I32") return DType::int32;         // AWQ/GPTQ packed codes, zeros and g_idx (Int4)
  return std::nullopt;
}

/// Writes "[a, b, c]" for messages.
inline std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Reads one unsigned JSON integer; FormatError names the file, tensor and field when it is not one
/// (negative, fractional, a string, ...).
inline std::uint64_t json_u64(const nlohmann::json& v, const std::string& file, const std::string& tensor,
                              std::string_view field) {
  if (!v.is_number_unsigned())
    throw FormatError(cat(file, ": tensor '", tensor, "': ", field, " must hold non-negative integers, found ",
                          v.dump()));
  return v.get<std::uint64_t>();
}

inline Tensor parse_entry(const std::string& file, const std::string& name, const nlohmann::json& entry,
                          std::span<const std::byte> data_section) {
  if (!entry.is_object())
    throw FormatError(cat(file, ": header entry '", name, "' must be an object with dtype, shape and data_offsets, found ",
                          entry.type_name()));
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = entry.find(key);
    if (it == entry.end()) throw FormatError(cat(file, ": tensor '", name, "' has no \"", key, "\" field"));
    return *it;
  };
  Tensor t;
  t.name = name;

  const auto& dtype = field("dtype");
  if (!dtype.is_string())
    throw FormatError(cat(file, ": tensor '", name, "': dtype must be a string, found ", dtype.dump()));
  const auto& dtype_name = dtype.get_ref<const std::string&>();
  auto dt = parse_dtype(dtype_name);
  if (!dt)
    throw UnsupportedError(cat(file, ": tensor '", name, "' has dtype ", dtype_name,
                               ", which infer does not load (supported: F32, F16, BF16, I8, F8_E4M3, I32)"));
  t.dtype = *dt;

  const auto& shape = field("shape");
  if (!shape.is_array())
    throw FormatError(cat(file, ": tensor '", name, "': shape must be an array, found ", shape.dump()));
  std::uint64_t elements = 1;
  for (const auto& d : shape) {
    const std::uint64_t dim = json_u64(d, file, name, "shape");
    if (dim != 0 && elements > std::numeric_limits<std::uint64_t>::max() / dim)
      throw FormatError(cat(file, ": tensor '", name, "': shape ", shape.dump(), " has more elements than fit in 64 bits"));
    elements *= dim;
    t.shape.push_back(dim);
  }
  const std::uint64_t esize = info(t.dtype).block_bytes;
  if (elements > std::numeric_limits<std::uint64_t>::max() / esize)
    throw FormatError(cat(file, ": tensor '", name, "': shape ", shape.dump(), " needs more bytes than fit in 64 bits"));
  const std::uint64_t nbytes = elements * esize;

  const auto& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    throw FormatError(cat(file, ": tensor '", name, "': data_offsets must be [begin, end], found ", offsets.dump()));
  const std::uint64_t begin = json_u64(offsets[0], file, name, "data_offsets");
  const std::uint64_t end = json_u64(offsets[1], file, name, "data_offsets");
  if (begin > end)
    throw FormatError(cat(file, ": tensor '", name, "': data_offsets begin ", begin, " is after end ", end));
  if (end > data_section.size())
    throw FormatError(cat(file, ": tensor '", name, "': data_offsets [", begin, ", ", end,
                          "] run past the end of the data section (", data_section.size(), " bytes)"));
  if (end - begin != nbytes)
    throw FormatError(cat(file, ": tensor '", name, "': data_offsets [", begin, ", ", end, "] hold ", end - begin,
                          " bytes, but shape ", shape_string(t.shape), " of ", dtype_name, " needs ", nbytes));
  t.begin = begin;
  t.data = data_section.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(nbytes));
  return t;
}

}  // namespace detail

/// One safetensors file, mapped read-only. Move-only; tensors' spans stay valid across moves.
class File {
 public:
  /// Maps and validates `path`. IoError when it cannot be read; FormatError/UnsupportedError as above.
  static File open(const std::filesystem::path& path) { return File(io::MappedFile::open(path)); }

  /// Validates an in-memory file; `name` stands in for the path in messages.
  static File from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
    return File(io::MappedFile::from_bytes(std::move(bytes), std::move(name)));
  }
  /// Validates an already mapped file.
  static File from_mapped(io::MappedFile file) { return File(std::move(file)); }

  /// All tensors, in ascending name order (the order is not meaningful in the format).
  [[nodiscard]] const std::vector<Tensor>& tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const Tensor* find(std::string_view name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                               [](const Tensor& t, std::string_view n) { return t.name < n; });
    return it != tensors_.end() && it->name == name ? &*it : nullptr;
  }
  /// The tensor called `name`; NotFoundError naming it and the file otherwise.
  [[nodiscard]] const Tensor& at(std::string_view name) const {
    if (const Tensor* t = find(name)) return *t;
    throw NotFoundError(infer::detail::cat("tensor '", name, "' is not in ", path(), " (", tensors_.size(), " tensors)"));
  }
  /// The free-form `__metadata__` strings (e.g. {"format": "pt"}); empty when the file has none.
  [[nodiscard]] const std::map<std::string, std::string, std::less<>>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const std::string& path() const noexcept { return file_.path(); }
  /// Size of the JSON header in bytes (N), and of the data section that follows it.
  [[nodiscard]] std::uint64_t header_bytes() const noexcept { return header_bytes_; }
  [[nodiscard]] std::uint64_t data_bytes() const noexcept { return file_.size() - 8 - header_bytes_; }

 private:
  explicit File(io::MappedFile file) : file_(std::move(file)) { parse(); }

  void parse() {
    using infer::detail::cat;
    const std::string& p = file_.path();
    const auto bytes = file_.bytes();
    if (bytes.size() < 8)
      throw FormatError(cat(p, ": file is ", bytes.size(),
                            " bytes, shorter than the 8-byte header length that starts a safetensors file"));
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);  // little-endian, checked by the static_assert above
    if (n > max_header_bytes)
      throw FormatError(cat(p, ": header length ", n, " bytes is over the ", max_header_bytes,
                            "-byte limit; the file is not safetensors or is corrupt"));
    if (n > bytes.size() - 8)
      throw FormatError(cat(p, ": header length ", n, " bytes runs past the end of the file (", bytes.size() - 8,
                            " bytes after the length)"));
    header_bytes_ = n;
    const char* hbegin = reinterpret_cast<const char*>(bytes.data() + 8);
    const auto data_section = bytes.subspan(static_cast<std::size_t>(8 + n));

    // nlohmann keeps the last of duplicate keys silently; a checkpoint naming a tensor twice is
    // ambiguous, so the parser callback rejects it while parsing.
    std::set<std::string, std::less<>> seen;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
      if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!seen.insert(key).second) throw FormatError(cat(p, ": header names '", key, "' twice"));
      }
      return true;
    };
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(hbegin, hbegin + n, on_event);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(cat(p, ": header (", n, " bytes at offset 8) is not valid JSON: ", e.what()));
    }
    if (!header.is_object())
      throw FormatError(cat(p, ": header must be a JSON object of tensors, found ", header.type_name()));

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object())
          throw FormatError(cat(p, ": __metadata__ must be an object of strings, found ", value.type_name()));
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            throw FormatError(cat(p, ": __metadata__ key '", mk, "' must be a string, found ", mv.dump()));
          metadata_.emplace(mk, mv.get<std::string>());
        }
        continue;
      }
      tensors_.push_back(detail::parse_entry(p, key, value, data_section));
    }
    // header.items() iterates std::map order, so tensors_ is already sorted by name for find().

    // Overlap: sort by begin; each non-empty tensor must start at or after the previous one's end.
    std::vector<const Tensor*> by_offset;
    for (const auto& t : tensors_)
      if (!t.data.empty()) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const Tensor* a, const Tensor* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < by_offset.size(); ++i) {
      const Tensor& a = *by_offset[i - 1];
      const Tensor& b = *by_offset[i];
      if (b.begin < a.begin + a.data.size())
        throw FormatError(cat(p, ": tensors '", a.name, "' [", a.begin, ", ", a.begin + a.data.size(), ") and '", b.name,
                              "' [", b.begin, ", ", b.begin + b.data.size(), ") overlap in the data section"));
    }
  }

  io::MappedFile file_;
  std::uint64_t header_bytes_ = 0;
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

/// Converts `t` to f32 into `out`, which must hold exactly `t.elements()` values.
inline void copy_f32(const Tensor& t, std::span<float> out) {
  const std::uint64_t n = t.elements();
  require<InvalidArgument>(out.size() == n, "copy_f32: tensor '", t.name, "' has ", n, " elements but the output holds ",
                           out.size());
  const std::byte* src = t.data.data();
  switch (t.dtype) {
    case DType::f32:
      if (n) std::memcpy(out.data(), src, n * 4);  // data may be unaligned: memcpy, never a cast
      return;
    case DType::f16:
    case DType::bf16: {
      const bool half = t.dtype == DType::f16;
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = half ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    default:
      throw UnsupportedError(infer::detail::cat("copy_f32: tensor '", t.name, "' has dtype ", name(t.dtype)));
  }
}

/// A host copy of `t` as f32 (f16/bf16 converted exactly).
[[nodiscard]] inline std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.elements()));
  copy_f32(t, v);
  return v;
}

/// A checkpoint as HF writes it into a model folder: either one `model.safetensors`, or shards
/// listed by `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}). Each shard is
/// opened once and every tensor is found through one combined lookup. Move-only.
/// The lookup is built from the shards' own headers (so a tensor the index forgot is still found);
/// the index is then checked against it: every entry must name the shard that really holds it.
class Checkpoint {
 public:
  static constexpr std::string_view single_file = "model.safetensors";
  static constexpr std::string_view index_file = "model.safetensors.index.json";

  /// `path` is a model folder (the index is preferred when both files are there), an index file, or
  /// a single .safetensors file. NotFoundError names the files looked for when there is neither.
  static Checkpoint open(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    using infer::detail::cat;
    Checkpoint c;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      c.dir_ = path;
      if (fs::exists(path / index_file, ec)) {
        c.open_index(path / index_file);
      } else if (fs::exists(path / single_file, ec)) {
        c.open_single(path / single_file);
      } else {
        throw NotFoundError(cat("no safetensors checkpoint in '", path.string(), "': neither ", single_file, " nor ",
                                index_file, " exists there"));
      }
    } else {
      c.dir_ = path.parent_path();
      const std::string fname = path.filename().string();
      if (fname.size() >= 5 && fname.compare(fname.size() - 5, 5, ".json") == 0) c.open_index(path);
      else c.open_single(path);
    }
    return c;
  }

  /// The tensor called `name` in whichever shard holds it, or nullptr.
  [[nodiscard]] const Tensor* find(std::string_view name) const {
    auto it = lookup_.find(name);
    if (it == lookup_.end()) return nullptr;
    return &shards_[it->second.first].tensors()[it->second.second];
  }
  /// The tensor called `name`; NotFoundError naming it and every file searched otherwise.
  [[nodiscard]] const Tensor& at(std::string_view name) const {
    if (const Tensor* t = find(name)) return *t;
    std::string files;
    for (const auto& s : shards_) files += (files.empty() ? "" : ", ") + s.path();
    throw NotFoundError(infer::detail::cat("tensor '", name, "' is in none of the checkpoint's ", shards_.size(),
                                           " file(s): ", files));
  }
  /// The shard file holding tensor `name`; NotFoundError as `at`.
  [[nodiscard]] const File& shard_of(std::string_view name) const {
    (void)at(name);
    return shards_[lookup_.find(name)->second.first];
  }
  [[nodiscard]] const std::vector<File>& shards() const noexcept { return shards_; }
  /// Every tensor name, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> v;
    v.reserve(lookup_.size());
    for (const auto& [k, _] : lookup_) v.push_back(k);
    return v;
  }
  [[nodiscard]] std::size_t size() const noexcept { return lookup_.size(); }
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

 private:
  Checkpoint() = default;

  void open_single(const std::filesystem::path& file) {
    shards_.push_back(File::open(file));
    index_shard(0);
  }

  void open_index(const std::filesystem::path& index_path) {
    using infer::detail::cat;
    const std::string ip = index_path.string();
    const auto mapped = io::MappedFile::open(index_path);
    const char* b = reinterpret_cast<const char*>(mapped.bytes().data());
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(b, b + mapped.size());
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(cat(ip, ": not valid JSON: ", e.what()));
    }
    if (!index.is_object()) throw FormatError(cat(ip, ": must be a JSON object, found ", index.type_name()));
    auto wm = index.find("weight_map");
    if (wm == index.end()) throw FormatError(cat(ip, ": has no \"weight_map\""));
    if (!wm->is_object())
      throw FormatError(cat(ip, ": \"weight_map\" must be an object of tensor -> file, found ", wm->type_name()));

    std::map<std::string, std::size_t, std::less<>> shard_ids;  // file name -> index in shards_
    std::vector<std::pair<std::string, std::string>> expected;  // tensor -> file, from the index
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string())
        throw FormatError(cat(ip, ": weight_map entry '", tensor, "' must name a file, found ", file.dump()));
      const auto& fname = file.get_ref<const std::string&>();
      // Shards live next to the index; a path that climbs out of the folder is not a checkpoint's.
      const std::filesystem::path rel(fname);
      bool climbs = fname.empty() || rel.is_absolute();
      for (const auto& part : rel) climbs = climbs || part == "..";
      if (climbs)
        throw FormatError(cat(ip, ": weight_map entry '", tensor, "' names file '", fname,
                              "'; shard files must be relative paths inside the checkpoint folder"));
      shard_ids.emplace(fname, 0);
      expected.emplace_back(tensor, fname);
    }
    for (auto& [fname, id] : shard_ids) {
      id = shards_.size();
      const auto shard_path = dir_ / fname;
      try {
        shards_.push_back(File::open(shard_path));
      } catch (const IoError& e) {
        throw IoError(cat(ip, " lists shard '", fname, "', which cannot be read: ", e.what()));
      }
      index_shard(id);
    }
    for (const auto& [tensor, fname] : expected) {
      auto it = lookup_.find(tensor);
      const std::size_t want = shard_ids.find(fname)->second;
      if (it == lookup_.end() || it->second.first != want)
        throw FormatError(cat(ip, " maps tensor '", tensor, "' to ", shards_[want].path(),
                              ", which does not contain it"));
    }
  }

  /// Adds shard `id`'s tensors to the combined lookup; a name already there is ambiguous.
  void index_shard(std::size_t id) {
    const auto& ts = shards_[id].tensors();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      auto [it, inserted] = lookup_.emplace(ts[i].name, std::pair{id, i});
      if (!inserted)
        throw FormatError(infer::detail::cat("tensor '", ts[i].name, "' is in two shards: ",
                                             shards_[it->second.first].path(), " and ", shards_[id].path()));
    }
  }

  std::filesystem::path dir_;
  std::vector<File> shards_;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> lookup_;  // name -> (shard, tensor)
};

}  // namespace infer::safetensors
