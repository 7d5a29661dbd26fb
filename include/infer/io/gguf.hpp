#pragma once
/// \file
/// GGUF reader: metadata (typed key/values, nested arrays) and tensor descriptions whose data are
/// bounds-checked views into the memory-mapped file.
///
/// Layout (little-endian): "GGUF", u32 version (2 or 3), u64 tensor_count, u64 kv_count; kv_count
/// entries of {string key, u32 value type, value}; tensor_count infos of {string name, u32 n_dims,
/// u64 dims[n_dims], u32 ggml type, u64 offset}; padding to `general.alignment` (default 32); the data
/// section. Strings are a u64 byte length and the bytes; arrays a u32 element type, u64 count, items.
///
/// The file is untrusted input: every read is bounds-checked, every count is checked against the
/// bytes left *before* anything is allocated, every size product is overflow-checked, and all
/// problems surface as FormatError / UnsupportedError naming the offset, key or tensor concerned.
/// Host-only (never included by .cu files).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/io/mapped_file.hpp"
#include "infer/quant/dequantize.hpp"

namespace infer::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

enum class ValueType : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12
};

inline std::string_view name(ValueType t) {
  switch (t) {
    case ValueType::u8: return "u8";
    case ValueType::i8: return "i8";
    case ValueType::u16: return "u16";
    case ValueType::i16: return "i16";
    case ValueType::u32: return "u32";
    case ValueType::i32: return "i32";
    case ValueType::f32: return "f32";
    case ValueType::boolean: return "bool";
    case ValueType::string: return "string";
    case ValueType::array: return "array";
    case ValueType::u64: return "u64";
    case ValueType::i64: return "i64";
    case ValueType::f64: return "f64";
  }
  return "unknown";
}

struct Value;
/// A metadata array: all items have `elem_type` (items may themselves be arrays).
struct Array {
  ValueType elem_type = ValueType::u8;
  std::vector<Value> items;
};

/// One metadata value. Variant alternatives are in ValueType order except that Array comes last.
struct Value {
  std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t, float, bool,
               std::string, std::uint64_t, std::int64_t, double, Array>
      v;

  [[nodiscard]] ValueType type() const {
    constexpr ValueType by_index[] = {ValueType::u8,  ValueType::i8,      ValueType::u16,    ValueType::i16,
                                      ValueType::u32, ValueType::i32,     ValueType::f32,    ValueType::boolean,
                                      ValueType::string, ValueType::u64,  ValueType::i64,    ValueType::f64,
                                      ValueType::array};
    const std::size_t i = v.index();
    if (i >= std::size(by_index)) throw InvalidArgument("gguf::Value is valueless (an assignment to it threw)");
    return by_index[i];
  }

  /// Any integer type (not bool); a u64 above INT64_MAX gives nullopt.
  [[nodiscard]] std::optional<std::int64_t> as_int() const {
    return std::visit(
        [](const auto& x) -> std::optional<std::int64_t> {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::uint64_t>) {
            if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
            return static_cast<std::int64_t>(x);
          } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            return static_cast<std::int64_t>(x);
          } else {
            return std::nullopt;
          }
        },
        v);
  }

  /// Any integer or floating type (not bool).
  [[nodiscard]] std::optional<double> as_float() const {
    return std::visit(
        [](const auto& x) -> std::optional<double> {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) return static_cast<double>(x);
          else return std::nullopt;
        },
        v);
  }

  [[nodiscard]] const std::string* as_string() const { return std::get_if<std::string>(&v); }
  [[nodiscard]] const Array* as_array() const { return std::get_if<Array>(&v); }

  /// Short human-readable form: strings quoted (long ones cut), arrays show at most `max_items` items.
  [[nodiscard]] std::string to_display(std::size_t max_items = 8) const {
    std::ostringstream os;
    display(os, max_items);
    return os.str();
  }

 private:
  void display(std::ostringstream& os, std::size_t max_items) const {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, bool>) {
            os << (x ? "true" : "false");
          } else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>) {
            os << static_cast<int>(x);  // not as a character
          } else if constexpr (std::is_same_v<T, std::string>) {
            constexpr std::size_t kMaxChars = 60;
            os << '"' << std::string_view(x).substr(0, kMaxChars) << (x.size() > kMaxChars ? "...\"" : "\"");
          } else if constexpr (std::is_same_v<T, Array>) {
            os << '[';
            const std::size_t shown = std::min(max_items, x.items.size());
            for (std::size_t i = 0; i < shown; ++i) {
              if (i) os << ", ";
              x.items[i].display(os, max_items);
            }
            if (shown < x.items.size()) os << (shown ? ", " : "") << "... (" << x.items.size() << " items)";
            os << ']';
          } else {
            os << x;
          }
        },
        v);
  }
};

struct TensorInfo {
  std::string name;
  DType type;
  std::vector<std::uint64_t> shape;  ///< ggml order: shape[0] is the contiguous (fastest) dimension
  std::uint64_t offset;              ///< from the start of the data section
  std::uint64_t bytes;
  /// Product of the shape (validated against overflow when the file was parsed).
  [[nodiscard]] std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::span<const std::byte> data;  ///< exactly `bytes` bytes inside the mapped file
};

namespace detail {

using infer::detail::cat;

/// ggml type ids this reader decodes; every other id is reported by name when known.
inline std::optional<DType> dtype_from_ggml(std::uint32_t id) {
  switch (id) {
    case 0: return DType::f32;
    case 1: return DType::f16;
    case 2: return DType::q4_0;
    case 3: return DType::q4_1;
    case 6: return DType::q5_0;
    case 7: return DType::q5_1;
    case 8: return DType::q8_0;
    case 12: return DType::q4_k;
    case 13: return DType::q5_k;
    case 14: return DType::q6_k;
    case 20: return DType::iq4_nl;
    case 23: return DType::iq4_xs;
    case 30: return DType::bf16;
    default: return std::nullopt;
  }
}

inline std::string_view ggml_type_name(std::uint32_t id) {
  constexpr std::string_view names[] = {
      "F32",     "F16",     "Q4_0",     "Q4_1",   "Q4_2 (removed)", "Q4_3 (removed)", "Q5_0",   "Q5_1",
      "Q8_0",    "Q8_1",    "Q2_K",     "Q3_K",   "Q4_K",           "Q5_K",           "Q6_K",   "Q8_K",
      "IQ2_XXS", "IQ2_XS",  "IQ3_XXS",  "IQ1_S",  "IQ4_NL",         "IQ3_S",          "IQ2_S",  "IQ4_XS",
      "I8",      "I16",     "I32",      "I64",    "F64",            "IQ1_M",          "BF16",   "Q4_0_4_4",
      "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",  "TQ2_0",  "IQ4_NL_4_4",     "IQ4_NL_4_8",     "IQ4_NL_8_8", "MXFP4"};
  return id < std::size(names) ? names[id] : std::string_view{};
}

/// "F32, F16, Q4_0, ...": the ggml types dtype_from_ggml decodes, in id order, for error messages (built from
/// the mapping, so the message cannot fall behind it).
inline std::string supported_ggml_types() {
  std::string out;
  for (std::uint32_t id = 0; !ggml_type_name(id).empty(); ++id)
    if (dtype_from_ggml(id)) out += cat(out.empty() ? "" : ", ", ggml_type_name(id));
  return out;
}

/// Smallest encoding of one value of `t` (arrays and strings: their headers), for count checks.
inline std::optional<std::uint64_t> min_value_bytes(std::uint32_t t) {
  switch (static_cast<ValueType>(t)) {
    case ValueType::u8:
    case ValueType::i8:
    case ValueType::boolean: return 1;
    case ValueType::u16:
    case ValueType::i16: return 2;
    case ValueType::u32:
    case ValueType::i32:
    case ValueType::f32: return 4;
    case ValueType::u64:
    case ValueType::i64:
    case ValueType::f64:
    case ValueType::string: return 8;
    case ValueType::array: return 12;
  }
  return std::nullopt;
}

inline constexpr int kMaxArrayDepth = 8;
inline constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, 1-byte value
inline constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim

/// Cursor over the file's bytes. Every read checks the bytes left and, on failure, says where it
/// was, what it was reading and for which key or tensor.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const std::string& source) : b_(bytes), source_(source) {}

  [[nodiscard]] std::uint64_t pos() const { return pos_; }
  [[nodiscard]] std::uint64_t left() const { return b_.size() - pos_; }
  /// What is being read, for messages: "metadata key 'x'", "tensor 'y'"; empty for the header.
  void set_context(std::string ctx) { ctx_ = std::move(ctx); }

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(cat("GGUF '", source_, "': ", what, context()));
  }
  [[nodiscard]] std::string context() const {
    if (ctx_.empty()) return {};
    return cat(" (in ", ctx_, ")");
  }

  void need(std::uint64_t n, const char* what) const {
    if (n > left())
      throw FormatError(cat("GGUF '", source_, "': truncated at offset ", pos_, " reading ", what, context(), ": need ",
                            n, " bytes, ", left(), " left (file is ", b_.size(), " bytes)"));
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T x;
    std::memcpy(&x, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }

  std::string read_string(const char* what) {
    const std::uint64_t start = pos_;
    const auto len = read<std::uint64_t>(what);
    if (len > left())
      throw FormatError(cat("GGUF '", source_, "': ", what, " at offset ", start, context(), " claims ", len,
                            " bytes, but only ", left(), " remain in the file"));
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }

  Value read_value(std::uint32_t type, int depth) {
    switch (static_cast<ValueType>(type)) {
      case ValueType::u8: return {read<std::uint8_t>("u8 value")};
      case ValueType::i8: return {read<std::int8_t>("i8 value")};
      case ValueType::u16: return {read<std::uint16_t>("u16 value")};
      case ValueType::i16: return {read<std::int16_t>("i16 value")};
      case ValueType::u32: return {read<std::uint32_t>("u32 value")};
      case ValueType::i32: return {read<std::int32_t>("i32 value")};
      case ValueType::f32: return {read<float>("f32 value")};
      case ValueType::u64: return {read<std::uint64_t>("u64 value")};
      case ValueType::i64: return {read<std::int64_t>("i64 value")};
      case ValueType::f64: return {read<double>("f64 value")};
      case ValueType::boolean: {
        const std::uint64_t at = pos_;
        const auto x = read<std::uint8_t>("bool value");
        if (x > 1) fail(cat("bool value at offset ", at, " is ", static_cast<int>(x), " (must be 0 or 1)"));
        return {x == 1};
      }
      case ValueType::string: return {read_string("string length")};
      case ValueType::array: return {read_array(depth + 1)};
    }
    fail(cat("unknown value type ", type, " at offset ", pos_ - 4, " (known types are 0..12)"));
  }

 private:
  Array read_array(int depth) {
    const std::uint64_t start = pos_;
    if (depth > kMaxArrayDepth)
      fail(cat("array at offset ", start, " is nested deeper than ", kMaxArrayDepth, " levels"));
    const auto elem = read<std::uint32_t>("array element type");
    const auto min = min_value_bytes(elem);
    if (!min) fail(cat("array at offset ", start, " has unknown element type ", elem, " (known types are 0..12)"));
    const auto count = read<std::uint64_t>("array length");
    if (count > left() / *min)
      fail(cat("array at offset ", start, " claims ", count, " items of type ", name(static_cast<ValueType>(elem)),
               " (at least ", *min, " bytes each), but only ", left(), " bytes remain"));
    Array a;
    a.elem_type = static_cast<ValueType>(elem);
    a.items.reserve(static_cast<std::size_t>(count));
    for (std::uint64_t i = 0; i < count; ++i) a.items.push_back(read_value(elem, depth));
    return a;
  }

  std::span<const std::byte> b_;
  const std::string& source_;
  std::uint64_t pos_ = 0;
  std::string ctx_;
};

template <class T>
constexpr std::string_view expected_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, double>) return "f64";
  else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return "i8";
    else if constexpr (sizeof(T) == 2) return "i16";
    else if constexpr (sizeof(T) == 4) return "i32";
    else return "i64";
  } else {
    if constexpr (sizeof(T) == 1) return "u8";
    else if constexpr (sizeof(T) == 2) return "u16";
    else if constexpr (sizeof(T) == 4) return "u32";
    else return "u64";
  }
}

/// Converts a metadata value to T with the rules of File::get; `what` names it in errors.
template <class T>
T convert(const Value& v, const std::string& what) {
  static_assert(std::is_same_v<T, bool> || std::is_integral_v<T> || std::is_floating_point_v<T> ||
                    std::is_same_v<T, std::string>,
                "gguf::File::get<T>: T must be bool, an integral type, float, double or std::string");
  auto type_error = [&]() -> FormatError {
    return FormatError(cat(what, " has type ", name(v.type()), ", expected ", expected_name<T>()));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (const bool* b = std::get_if<bool>(&v.v)) return *b;
    throw type_error();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (const std::string* s = v.as_string()) return *s;
    throw type_error();
  } else if constexpr (std::is_integral_v<T>) {
    if (const auto* u = std::get_if<std::uint64_t>(&v.v)) {
      if (*u > static_cast<std::make_unsigned_t<T>>(std::numeric_limits<T>::max()))
        throw FormatError(cat(what, " = ", *u, " (u64) is out of range for ", expected_name<T>()));
      return static_cast<T>(*u);
    }
    const auto i = v.as_int();
    if (!i) throw type_error();
    if (!std::in_range<T>(*i))
      throw FormatError(cat(what, " = ", *i, " (", name(v.type()), ") is out of range for ", expected_name<T>()));
    return static_cast<T>(*i);
  } else {
    const auto d = v.as_float();
    if (!d) throw type_error();
    if constexpr (std::is_same_v<T, float>) {
      if (std::isfinite(*d) && std::fabs(*d) > static_cast<double>(std::numeric_limits<float>::max()))
        throw FormatError(cat(what, " = ", *d, " (", name(v.type()), ") is out of range for f32"));
    }
    return static_cast<T>(*d);
  }
}

inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

inline std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

}  // namespace detail

class File {
 public:
  /// Memory-maps and parses `path`. IoError when it cannot be read, FormatError when malformed,
  /// UnsupportedError for a version or tensor type this reader does not handle.
  static File open(const std::filesystem::path& path) { return File(io::MappedFile::open(path)); }
  /// The same parser over an owned buffer (tests, fuzzing).
  static File from_bytes(std::vector<std::byte> bytes) {
    return File(io::MappedFile::from_bytes(std::move(bytes)));
  }

  [[nodiscard]] std::uint32_t version() const { return version_; }
  [[nodiscard]] std::uint64_t alignment() const { return alignment_; }
  /// Offset of the data section from the start of the file.
  [[nodiscard]] std::uint64_t data_offset() const { return data_offset_; }
  /// The path (or "<memory>") used in error messages.
  [[nodiscard]] const std::string& source() const { return file_.path(); }

  /// In file order.
  [[nodiscard]] const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  [[nodiscard]] const Value* find(std::string_view key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
  }
  [[nodiscard]] const Value& at(std::string_view key) const {
    if (const Value* v = find(key)) return *v;
    throw NotFoundError(detail::cat("GGUF '", source(), "': metadata key '", key, "' not found"));
  }

  /// Typed getter: integers convert with a range check, floats accept any numeric type. FormatError
  /// (naming key, expected and actual type) on a mismatch, NotFoundError when the key is absent.
  template <class T>
  [[nodiscard]] T get(std::string_view key) const {
    return detail::convert<T>(at(key), key_what(key));
  }
  /// As get(), but nullopt when the key is absent (a present key of the wrong type still throws).
  template <class T>
  [[nodiscard]] std::optional<T> get_optional(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    return detail::convert<T>(*v, key_what(key));
  }

  /// An array of strings.
  [[nodiscard]] std::vector<std::string> get_strings(std::string_view key) const {
    const Array& a = array_of(key, "string", [](ValueType t) { return t == ValueType::string; });
    std::vector<std::string> out;
    out.reserve(a.items.size());
    for (const Value& v : a.items) out.push_back(*v.as_string());
    return out;
  }
  /// An array of any integer type.
  [[nodiscard]] std::vector<std::int64_t> get_ints(std::string_view key) const {
    const Array& a = array_of(key, "integers", is_integer);
    std::vector<std::int64_t> out;
    out.reserve(a.items.size());
    for (std::size_t i = 0; i < a.items.size(); ++i) {
      const auto x = a.items[i].as_int();
      if (!x)
        throw FormatError(detail::cat(key_what(key), ": item ", i, " = ", a.items[i].to_display(),
                                      " does not fit in i64"));
      out.push_back(*x);
    }
    return out;
  }
  /// An array of any numeric type.
  [[nodiscard]] std::vector<double> get_floats(std::string_view key) const {
    const Array& a = array_of(key, "numbers", [](ValueType t) { return is_integer(t) || t == ValueType::f32 || t == ValueType::f64; });
    std::vector<double> out;
    out.reserve(a.items.size());
    for (const Value& v : a.items) out.push_back(*v.as_float());
    return out;
  }

  [[nodiscard]] const std::vector<TensorInfo>& tensors() const { return tensors_; }
  [[nodiscard]] const TensorInfo* find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  [[nodiscard]] const TensorInfo& tensor(std::string_view name) const {
    if (const TensorInfo* t = find_tensor(name)) return *t;
    throw NotFoundError(detail::cat("GGUF '", source(), "': tensor '", name, "' not found (the file has ",
                                    tensors_.size(), " tensors)"));
  }

  /// Host f32 copy of a tensor of any supported type. Uses infer::kernels::cpu::dequantize, so a program
  /// calling this links infer::kernels.
  [[nodiscard]] std::vector<float> dequantize(const TensorInfo& t) const {
    std::vector<float> out(static_cast<std::size_t>(t.elements()));
    kernels::cpu::dequantize(t.type, t.data, out);
    return out;
  }

  /// "general.architecture" (NotFoundError when absent, FormatError when not a string).
  [[nodiscard]] std::string_view architecture() const {
    const Value& v = at("general.architecture");
    if (const std::string* s = v.as_string()) return *s;
    throw FormatError(detail::cat(key_what("general.architecture"), " has type ", name(v.type()), ", expected string"));
  }

 private:
  explicit File(io::MappedFile file) : file_(std::move(file)) { parse(); }

  static bool is_integer(ValueType t) {
    switch (t) {
      case ValueType::u8: case ValueType::i8: case ValueType::u16: case ValueType::i16:
      case ValueType::u32: case ValueType::i32: case ValueType::u64: case ValueType::i64: return true;
      default: return false;
    }
  }

  std::string key_what(std::string_view key) const {
    return detail::cat("GGUF '", source(), "': metadata key '", key, "'");
  }

  template <class Pred>
  const Array& array_of(std::string_view key, const char* expected, Pred ok) const {
    const Value& v = at(key);
    const Array* a = v.as_array();
    if (!a) throw FormatError(detail::cat(key_what(key), " has type ", name(v.type()), ", expected an array of ", expected));
    if (!ok(a->elem_type))
      throw FormatError(detail::cat(key_what(key), " is an array of ", name(a->elem_type), ", expected an array of ",
                                    expected));
    return *a;
  }

  void parse() {
    using detail::cat;
    const auto bytes = file_.bytes();
    const std::string& src = file_.path();
    detail::Reader r(bytes, src);

    // ---- header
    r.need(4, "magic");
    if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
      std::ostringstream hex;
      for (int i = 0; i < 4; ++i) {
        const auto c = static_cast<unsigned>(bytes[static_cast<std::size_t>(i)]);
        hex << (i ? " " : "") << "0123456789abcdef"[c >> 4] << "0123456789abcdef"[c & 15];
      }
      throw FormatError(cat("GGUF '", src, "': bad magic: expected 'GGUF' (47 47 55 46), found ", hex.str(),
                            "; not a GGUF file"));
    }
    r.read<std::uint32_t>("magic");
    version_ = r.read<std::uint32_t>("version");
    if (version_ != 2 && version_ != 3) {
      const std::uint32_t swapped = __builtin_bswap32(version_);
      if ((version_ & 0xffffu) == 0 && swapped >= 1 && swapped <= 3)
        throw UnsupportedError(cat("GGUF '", src, "': big-endian file (version field reads ", version_,
                                   ", i.e. version ", swapped, " byte-swapped); only little-endian GGUF is supported"));
      if (version_ == 1)
        throw UnsupportedError(cat("GGUF '", src, "': version 1 is not supported (this reader handles versions 2 "
                                   "and 3); re-convert the model with a current converter"));
      throw UnsupportedError(cat("GGUF '", src, "': version ", version_,
                                 " is not supported (this reader handles versions 2 and 3)"));
    }
    const auto tensor_count = r.read<std::uint64_t>("tensor count");
    const auto kv_count = r.read<std::uint64_t>("metadata count");
    if (kv_count > r.left() / detail::kMinKvBytes)
      r.fail(cat("metadata count ", kv_count, " cannot fit in the ", r.left(), " bytes after the header (each entry ",
                 "takes at least ", detail::kMinKvBytes, ")"));
    if (tensor_count > (r.left() - kv_count * detail::kMinKvBytes) / detail::kMinTensorInfoBytes)
      r.fail(cat("tensor count ", tensor_count, " cannot fit in the ", r.left(), " bytes after the header (each ",
                 "tensor info takes at least ", detail::kMinTensorInfoBytes, ")"));

    // ---- metadata
    metadata_.reserve(static_cast<std::size_t>(kv_count));
    for (std::uint64_t i = 0; i < kv_count; ++i) {
      r.set_context(cat("metadata entry ", i, " of ", kv_count));
      const std::uint64_t at = r.pos();
      std::string key = r.read_string("metadata key");
      r.set_context(cat("metadata key '", key, "'"));
      if (key_index_.count(key))
        r.fail(cat("duplicate metadata key at offset ", at, " (entries ", key_index_.find(key)->second, " and ", i, ")"));
      const auto type = r.read<std::uint32_t>("value type");
      Value v = r.read_value(type, 0);
      key_index_.emplace(key, metadata_.size());
      metadata_.emplace_back(std::move(key), std::move(v));
    }
    r.set_context({});

    // ---- alignment
    if (const Value* a = find("general.alignment")) {
      const auto n = a->as_int();
      if (!n) throw FormatError(cat(key_what("general.alignment"), " has type ", name(a->type()),
                                    ", expected an unsigned integer (u32)"));
      if (*n <= 0 || !std::has_single_bit(static_cast<std::uint64_t>(*n)))
        throw FormatError(cat(key_what("general.alignment"), " = ", *n, " is not a positive power of two"));
      alignment_ = static_cast<std::uint64_t>(*n);
    }

    // ---- tensor infos
    tensors_.reserve(static_cast<std::size_t>(tensor_count));
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
      const std::uint64_t at = r.pos();
      TensorInfo t{};
      r.set_context(cat("tensor info ", i, " of ", tensor_count));
      t.name = r.read_string("tensor name");
      r.set_context(cat("tensor '", t.name, "'"));
      if (tensor_index_.count(t.name))
        r.fail(cat("duplicate tensor name at offset ", at, " (tensors ", tensor_index_.find(t.name)->second, " and ", i, ")"));
      const auto n_dims = r.read<std::uint32_t>("dimension count");
      if (n_dims < 1 || n_dims > 4) r.fail(cat("dimension count ", n_dims, " at offset ", r.pos() - 4, " is not in 1..4"));
      t.shape.resize(n_dims);
      for (auto& d : t.shape) d = r.read<std::uint64_t>("tensor dimension");
      const auto ggml_type = r.read<std::uint32_t>("tensor type");
      t.offset = r.read<std::uint64_t>("tensor data offset");
      const auto dt = detail::dtype_from_ggml(ggml_type);
      if (!dt) {
        const auto known = detail::ggml_type_name(ggml_type);
        throw UnsupportedError(cat("GGUF '", src, "': tensor '", t.name, "' has ggml type ", ggml_type,
                                   known.empty() ? std::string(" (unknown)") : cat(" (", known, ")"),
                                   ", which this reader does not support (supported: ",
                                   detail::supported_ggml_types(), ")"));
      }
      t.type = *dt;
      std::uint64_t elems = 1, rows = 1;
      for (std::size_t k = 0; k < t.shape.size(); ++k) {
        if (!detail::checked_mul(elems, t.shape[k], elems) || (k > 0 && !detail::checked_mul(rows, t.shape[k], rows)))
          r.fail(cat("element count of shape ", detail::shape_string(t.shape), " overflows 64 bits"));
      }
      const DTypeInfo ti = info(t.type);
      if (t.shape[0] % ti.block_elems != 0)
        r.fail(cat("first dimension ", t.shape[0], " of a ", name(t.type), " tensor is not a multiple of its block size ",
                   ti.block_elems));
      const auto row = row_bytes(t.type, t.shape[0]);  // nullopt now only on overflow
      if (!row || !detail::checked_mul(*row, rows, t.bytes))
        r.fail(cat("byte size of shape ", detail::shape_string(t.shape), " overflows 64 bits"));
      if (t.offset % alignment_ != 0)
        r.fail(cat("data offset ", t.offset, " is not a multiple of the alignment ", alignment_));
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    r.set_context({});

    // ---- data section
    const std::uint64_t end_of_infos = r.pos();
    const std::uint64_t pad = (alignment_ - end_of_infos % alignment_) % alignment_;
    if (!detail::checked_add(end_of_infos, pad, data_offset_)) data_offset_ = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t size = bytes.size();
    for (auto& t : tensors_) {
      std::uint64_t begin = 0, end = 0;
      if (!detail::checked_add(data_offset_, t.offset, begin) || !detail::checked_add(begin, t.bytes, end) || end > size)
        throw FormatError(cat("GGUF '", src, "': tensor '", t.name, "' data (", t.bytes, " bytes at data offset ",
                              t.offset, ", data section at ", data_offset_,
                              ") lies past the end of the file (", size, " bytes)"));
      t.data = bytes.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(t.bytes));
    }
  }

  io::MappedFile file_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::map<std::string, std::size_t, std::less<>> key_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace infer::gguf
