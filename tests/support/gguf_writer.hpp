#pragma once
/// Test-only GGUF writer: builds v2/v3 byte buffers with metadata of every type (nested arrays
/// included) and tensors with data, and records where each field landed so tests can corrupt exactly
/// one of them. Not a general writer: it trusts its caller (data sizes are not checked).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "infer/io/gguf.hpp"

namespace infer::test {

/// Byte offsets of the fields of a built file.
struct GgufLayout {
  static constexpr std::size_t version_at = 4, tensor_count_at = 8, kv_count_at = 16;
  struct Kv {
    std::string key;
    std::size_t key_len_at, type_at, value_at;
  };
  struct Tensor {
    std::string name;
    std::size_t name_len_at, n_dims_at, dims_at, type_at, offset_at, data_at;
  };
  std::vector<Kv> kvs;
  std::vector<Tensor> tensors;
  std::size_t infos_end = 0;  ///< first byte after the last tensor info
  std::size_t data_at = 0;    ///< start of the data section
  [[nodiscard]] const Kv& kv(const std::string& key) const {
    for (const auto& k : kvs)
      if (k.key == key) return k;
    throw std::out_of_range("GgufLayout: no key " + key);
  }
  [[nodiscard]] const Tensor& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return t;
    throw std::out_of_range("GgufLayout: no tensor " + name);
  }
};

class GgufWriter {
 public:
  explicit GgufWriter(std::uint32_t version = 3) : version_(version) {}

  GgufWriter& add(std::string key, gguf::Value v) {
    kvs_.emplace_back(std::move(key), std::move(v));
    return *this;
  }
  /// Sets `general.alignment` (as u32) and pads the data with it.
  GgufWriter& alignment(std::uint32_t a) {
    alignment_ = a;
    return add("general.alignment", gguf::Value{a});
  }
  /// Pads with `a` without writing any key (to build files whose padding disagrees with the key).
  GgufWriter& pad_alignment(std::uint64_t a) {
    alignment_ = a;
    return *this;
  }
  GgufWriter& tensor(std::string name, std::uint32_t ggml_type, std::vector<std::uint64_t> shape,
                     std::vector<std::byte> data) {
    tensors_.push_back({std::move(name), ggml_type, std::move(shape), std::move(data)});
    return *this;
  }
  GgufWriter& tensor_f32(std::string name, std::vector<std::uint64_t> shape, const std::vector<float>& values) {
    std::vector<std::byte> data(values.size() * 4);
    std::memcpy(data.data(), values.data(), data.size());
    return tensor(std::move(name), 0, std::move(shape), std::move(data));
  }

  [[nodiscard]] std::vector<std::byte> build(GgufLayout* layout = nullptr) const {
    Out o;
    GgufLayout l;
    o.raw("GGUF", 4);
    o.pod(version_);
    o.pod(static_cast<std::uint64_t>(tensors_.size()));
    o.pod(static_cast<std::uint64_t>(kvs_.size()));
    for (const auto& [key, v] : kvs_) {
      GgufLayout::Kv k{key, o.size(), 0, 0};
      o.str(key);
      k.type_at = o.size();
      o.pod(static_cast<std::uint32_t>(v.type()));
      k.value_at = o.size();
      payload(o, v);
      l.kvs.push_back(std::move(k));
    }
    std::vector<std::uint64_t> offsets;
    std::uint64_t next = 0;
    for (const auto& t : tensors_) {
      offsets.push_back(next);
      next += t.data.size();
      next += (alignment_ - next % alignment_) % alignment_;
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      GgufLayout::Tensor lt{t.name, o.size(), 0, 0, 0, 0, 0};
      o.str(t.name);
      lt.n_dims_at = o.size();
      o.pod(static_cast<std::uint32_t>(t.shape.size()));
      lt.dims_at = o.size();
      for (auto d : t.shape) o.pod(d);
      lt.type_at = o.size();
      o.pod(t.ggml_type);
      lt.offset_at = o.size();
      o.pod(offsets[i]);
      l.tensors.push_back(std::move(lt));
    }
    l.infos_end = o.size();
    o.pad(alignment_);
    l.data_at = o.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      l.tensors[i].data_at = o.size();
      o.raw(tensors_[i].data.data(), tensors_[i].data.size());
      o.pad(alignment_);
    }
    if (layout) *layout = std::move(l);
    return std::move(o.bytes);
  }

  // ---- byte patching helpers for corruption tests
  template <class T>
  static void put(std::vector<std::byte>& b, std::size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof v);
  }
  template <class T>
  static T get(const std::vector<std::byte>& b, std::size_t at) {
    T v;
    std::memcpy(&v, b.data() + at, sizeof v);
    return v;
  }

 private:
  struct Tensor {
    std::string name;
    std::uint32_t ggml_type;
    std::vector<std::uint64_t> shape;
    std::vector<std::byte> data;
  };
  struct Out {
    std::vector<std::byte> bytes;
    [[nodiscard]] std::size_t size() const { return bytes.size(); }
    void raw(const void* p, std::size_t n) {
      const auto* c = static_cast<const std::byte*>(p);
      bytes.insert(bytes.end(), c, c + n);
    }
    template <class T>
    void pod(T v) {
      raw(&v, sizeof v);
    }
    void str(const std::string& s) {
      pod(static_cast<std::uint64_t>(s.size()));
      raw(s.data(), s.size());
    }
    void pad(std::uint64_t a) {
      while (bytes.size() % a) bytes.push_back(std::byte{0});
    }
  };

  static void payload(Out& o, const gguf::Value& v) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            o.str(x);
          } else if constexpr (std::is_same_v<T, gguf::Array>) {
            o.pod(static_cast<std::uint32_t>(x.elem_type));
            o.pod(static_cast<std::uint64_t>(x.items.size()));
            for (const auto& item : x.items) payload(o, item);
          } else if constexpr (std::is_same_v<T, bool>) {
            o.pod(static_cast<std::uint8_t>(x ? 1 : 0));
          } else {
            o.pod(x);
          }
        },
        v.v);
  }

  std::uint32_t version_;
  std::uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, gguf::Value>> kvs_;
  std::vector<Tensor> tensors_;
};

/// Shorthands for building metadata values in tests.
inline gguf::Value str(std::string s) { return gguf::Value{std::move(s)}; }
inline gguf::Value arr(gguf::ValueType elem, std::vector<gguf::Value> items) {
  return gguf::Value{gguf::Array{elem, std::move(items)}};
}

}  // namespace infer::test
