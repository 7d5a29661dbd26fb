// The engine file's reader and writer (include/infer/io/engine_file.hpp has the format).
#include "infer/io/engine_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <system_error>

#include "infer/io/mapped_file.hpp"
#include "infer/memory/kv_dtype.hpp"

#if defined(INFER_HAVE_CUDA)
#include "infer/backend/cuda_runtime.hpp"
#endif

namespace infer {

using detail::cat;
using json = nlohmann::json;

namespace {

constexpr std::array<char, 8> kMagic{'I', 'N', 'F', 'E', 'R', 'E', 'N', 'G'};
constexpr std::uint64_t kPreamble = 32;   // magic, version, reserved, header length, header checksum
constexpr std::uint64_t kAlign = 4096;    // every part, and the data section, start on a page

std::uint64_t align_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::uint64_t fnv1a64(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) h = (h ^ static_cast<std::uint8_t>(b)) * 0x100000001b3ull;
  return h;
}

template <class T>
void put_le(std::byte* dst, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) dst[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}
template <class T>
T get_le(const std::byte* src) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(src[i]) << (8 * i);
  return static_cast<T>(v);
}

// ---- ModelConfig, EngineOptions, TokenizerSpec <-> JSON

json quantization_json(const QuantizationConfig& q) {
  return {{"method", q.method}, {"bits", q.bits}, {"group_size", q.group_size}, {"act_order", q.act_order},
          {"symmetric", q.symmetric}, {"weight_type", q.weight_type}, {"quantizer", q.quantizer}};
}

QuantizationConfig quantization_from(const json& j) {
  QuantizationConfig q;
  j.at("method").get_to(q.method);
  j.at("bits").get_to(q.bits);
  j.at("group_size").get_to(q.group_size);
  j.at("act_order").get_to(q.act_order);
  j.at("symmetric").get_to(q.symmetric);
  j.at("weight_type").get_to(q.weight_type);
  j.at("quantizer").get_to(q.quantizer);
  return q;
}

json config_json(const ModelConfig& c) {
  json rope = {{"kind", to_string(c.rope_scaling.kind)},
               {"factor", c.rope_scaling.factor},
               {"low_freq_factor", c.rope_scaling.low_freq_factor},
               {"high_freq_factor", c.rope_scaling.high_freq_factor},
               {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  return {{"family", to_string(c.family)},
          {"architecture", c.architecture},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"num_kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", rope},
          {"rope_style", to_string(c.rope_style)},
          {"rms_norm_eps", c.rms_norm_eps},
          {"max_position_embeddings", c.max_position_embeddings},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"attention_bias", c.attention_bias},
          {"sliding_window", c.sliding_window ? json(*c.sliding_window) : json(nullptr)},
          {"bos_token_id", c.bos_token_id ? json(*c.bos_token_id) : json(nullptr)},
          {"eos_token_ids", c.eos_token_ids},
          {"quantization", c.quantization ? quantization_json(*c.quantization) : json(nullptr)}};
}

template <class E, std::size_t N>
E enum_from(const json& j, const char* field, const std::array<E, N>& values) {
  const std::string s = j.at(field).get<std::string>();
  for (E v : values)
    if (to_string(v) == s) return v;
  throw FormatError(cat("'", field, "' = '", s, "' is not a value this version knows"));
}

ModelConfig config_from(const json& j) {
  ModelConfig c;
  c.family = enum_from(j, "family", std::array{ModelFamily::llama, ModelFamily::mistral, ModelFamily::qwen2});
  j.at("architecture").get_to(c.architecture);
  j.at("vocab_size").get_to(c.vocab_size);
  j.at("hidden_size").get_to(c.hidden_size);
  j.at("intermediate_size").get_to(c.intermediate_size);
  j.at("num_layers").get_to(c.num_layers);
  j.at("num_heads").get_to(c.num_heads);
  j.at("num_kv_heads").get_to(c.num_kv_heads);
  j.at("head_dim").get_to(c.head_dim);
  j.at("rope_theta").get_to(c.rope_theta);
  const json& r = j.at("rope_scaling");
  c.rope_scaling.kind =
      enum_from(r, "kind", std::array{RopeScaling::Kind::none, RopeScaling::Kind::linear, RopeScaling::Kind::llama3});
  r.at("factor").get_to(c.rope_scaling.factor);
  r.at("low_freq_factor").get_to(c.rope_scaling.low_freq_factor);
  r.at("high_freq_factor").get_to(c.rope_scaling.high_freq_factor);
  r.at("original_max_position_embeddings").get_to(c.rope_scaling.original_max_position_embeddings);
  c.rope_style = enum_from(j, "rope_style", std::array{RopeStyle::neox, RopeStyle::interleaved});
  j.at("rms_norm_eps").get_to(c.rms_norm_eps);
  j.at("max_position_embeddings").get_to(c.max_position_embeddings);
  j.at("tie_word_embeddings").get_to(c.tie_word_embeddings);
  j.at("attention_bias").get_to(c.attention_bias);
  if (!j.at("sliding_window").is_null()) c.sliding_window = j.at("sliding_window").get<std::int64_t>();
  if (!j.at("bos_token_id").is_null()) c.bos_token_id = j.at("bos_token_id").get<std::int64_t>();
  j.at("eos_token_ids").get_to(c.eos_token_ids);
  if (!j.at("quantization").is_null()) c.quantization = quantization_from(j.at("quantization"));
  c.validate();
  return c;
}

json options_json(const EngineOptions& o) {
  return {{"kv_cache_bytes", o.kv_cache_bytes},
          {"max_model_len", o.max_model_len},
          {"enable_prefix_caching", o.enable_prefix_caching},
          {"gpu_memory_utilization", o.gpu_memory_utilization},
          {"enforce_eager", o.enforce_eager},
          {"device_sampling", o.device_sampling},
          {"scheduler",
           {{"max_num_seqs", o.scheduler.max_num_seqs},
            {"max_num_batched_tokens", o.scheduler.max_num_batched_tokens},
            {"enable_chunked_prefill", o.scheduler.enable_chunked_prefill}}},
          {"static_shape",
           {{"max_batch", o.static_shape.max_batch},
            {"max_input", o.static_shape.max_input},
            {"max_output", o.static_shape.max_output}}}};
}

EngineOptions options_from(const json& j) {
  EngineOptions o;
  j.at("kv_cache_bytes").get_to(o.kv_cache_bytes);
  j.at("max_model_len").get_to(o.max_model_len);
  j.at("enable_prefix_caching").get_to(o.enable_prefix_caching);
  j.at("gpu_memory_utilization").get_to(o.gpu_memory_utilization);
  j.at("enforce_eager").get_to(o.enforce_eager);
  j.at("device_sampling").get_to(o.device_sampling);
  const json& s = j.at("scheduler");
  s.at("max_num_seqs").get_to(o.scheduler.max_num_seqs);
  s.at("max_num_batched_tokens").get_to(o.scheduler.max_num_batched_tokens);
  s.at("enable_chunked_prefill").get_to(o.scheduler.enable_chunked_prefill);
  const json& sh = j.at("static_shape");
  sh.at("max_batch").get_to(o.static_shape.max_batch);
  sh.at("max_input").get_to(o.static_shape.max_input);
  sh.at("max_output").get_to(o.static_shape.max_output);
  o.validate();
  return o;
}

json optional_id(const std::optional<std::int32_t>& id) { return id ? json(*id) : json(nullptr); }
std::optional<std::int32_t> optional_id_from(const json& j) {
  return j.is_null() ? std::nullopt : std::optional<std::int32_t>(j.get<std::int32_t>());
}

// Token strings are the vocabulary's byte-level alphabet or an added token's literal text: valid UTF-8,
// which JSON carries as it is.
json tokenizer_json(const TokenizerSpec& t) {
  json merges = json::array();
  for (const auto& [a, b] : t.merges) merges.push_back({a, b});
  json added = json::array();
  for (const auto& a : t.added_tokens) added.push_back({{"id", a.id}, {"content", a.content}, {"special", a.special}});
  return {{"tokens", t.tokens},
          {"merges", std::move(merges)},
          {"added_tokens", std::move(added)},
          {"pre_tokenizer", t.pre_tokenizer.patterns()},
          {"bos_id", optional_id(t.bos_id)},
          {"eos_id", optional_id(t.eos_id)},
          {"unknown_id", optional_id(t.unknown_id)},
          {"padding_id", optional_id(t.padding_id)},
          {"add_bos", t.add_bos},
          {"ignore_merges", t.ignore_merges},
          {"chat_template", t.chat_template}};
}

TokenizerSpec tokenizer_from(const json& j, const std::string& source) {
  TokenizerSpec t;
  j.at("tokens").get_to(t.tokens);
  for (const auto& m : j.at("merges")) t.merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
  for (const auto& a : j.at("added_tokens"))
    t.added_tokens.push_back({a.at("id").get<std::int32_t>(), a.at("content").get<std::string>(), a.at("special").get<bool>()});
  t.pre_tokenizer = PreTokenizer::from_patterns(j.at("pre_tokenizer").get<std::vector<std::string>>());
  t.bos_id = optional_id_from(j.at("bos_id"));
  t.eos_id = optional_id_from(j.at("eos_id"));
  t.unknown_id = optional_id_from(j.at("unknown_id"));
  t.padding_id = optional_id_from(j.at("padding_id"));
  j.at("add_bos").get_to(t.add_bos);
  j.at("ignore_merges").get_to(t.ignore_merges);
  j.at("chat_template").get_to(t.chat_template);
  t.source = source;
  return t;
}

}  // namespace

// ---- reading

struct EngineFile::Impl {
  std::filesystem::path path;
  std::optional<io::MappedFile> file;
  EngineFileInfo info;
  std::optional<TokenizerSpec> tokenizer;
  std::vector<EngineFilePart> parts;
  std::map<std::string, std::size_t, std::less<>> index;
  std::uint64_t data_offset = 0;
};

EngineFile::EngineFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngineFile::EngineFile(EngineFile&&) noexcept = default;
EngineFile& EngineFile::operator=(EngineFile&&) noexcept = default;
EngineFile::~EngineFile() = default;

bool EngineFile::is_engine_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, 8> head{};
  return in.read(head.data(), head.size()) && head == kMagic;
}

EngineFile EngineFile::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file.emplace(io::MappedFile::open(path));
  const std::string where = cat("engine file '", path.string(), "'");
  const std::span<const std::byte> all = impl->file->bytes();
  if (all.size() < 8 || std::memcmp(all.data(), kMagic.data(), kMagic.size()) != 0)
    throw FormatError(cat("'", path.string(), "' is not an infer engine file (it does not start with \"INFERENG\"); ",
                          "build one with infer-build"));
  if (all.size() < kPreamble)
    throw FormatError(cat(where, " is truncated: ", all.size(), " bytes, shorter than its ", kPreamble, "-byte preamble"));
  const auto version = get_le<std::uint32_t>(all.data() + 8);
  if (version < kOldestEngineFileVersion || version > kEngineFileVersion)
    throw UnsupportedError(cat(where, " has format version ", version, "; this build of infer reads versions ",
                               kOldestEngineFileVersion, " to ", kEngineFileVersion, ": rebuild it with this infer-build"));
  const auto header_len = get_le<std::uint64_t>(all.data() + 16);
  const auto checksum = get_le<std::uint64_t>(all.data() + 24);
  if (header_len > all.size() - kPreamble)
    throw FormatError(cat(where, " is truncated: ", all.size(), " bytes, but its header alone needs ", kPreamble + header_len));
  const auto header = all.subspan(kPreamble, header_len);
  if (fnv1a64(header) != checksum)
    throw FormatError(cat(where, ": the header is corrupted (its checksum does not match); rebuild the file"));

  json j;
  try {
    j = json::parse(reinterpret_cast<const char*>(header.data()), reinterpret_cast<const char*>(header.data()) + header.size());
    EngineFileInfo& info = impl->info;
    info.format_version = version;
    j.at("library_version").get_to(info.library_version);
    j.at("backend").get_to(info.backend);
    j.at("architecture").get_to(info.architecture);
    j.at("engine").get_to(info.engine);
    j.at("block_size").get_to(info.block_size);
    j.at("quantizer").get_to(info.quantizer);
    j.at("quantizer_layout").get_to(info.quantizer_layout);
    info.engine_options = options_from(j.at("engine_options"));
    info.config = config_from(j.at("config"));
    j.at("model").get_to(info.model);
    j.at("model_name").get_to(info.model_name);
    j.at("gemm_algorithms").get_to(info.gemm_algorithms);
    j.at("scalars").get_to(info.scalars);
    if (j.contains("kv_cache_scales")) {
      for (const auto& s : j.at("kv_cache_scales")) {
        const auto k = s.at(0).get<float>(), v = s.at(1).get<float>();
        if (!valid_kv_scale(k) || !valid_kv_scale(v))
          throw FormatError(cat("KV-cache scales ", k, ", ", v, " of layer ", info.kv_cache_scales.size(),
                                " are not positive and finite"));
        info.kv_cache_scales.emplace_back(k, v);
      }
      if (!info.kv_cache_scales.empty() &&
          static_cast<std::int64_t>(info.kv_cache_scales.size()) != info.config.num_layers)
        throw FormatError(cat(info.kv_cache_scales.size(), " layers of KV-cache scales for ", info.config.num_layers,
                              " layers"));
    }
    if (j.contains("tensor_parallel")) {  // version 4; a version 3 file holds the whole model
      const auto& tp = j.at("tensor_parallel");
      info.tensor_parallel = {tp.at(0).get<int>(), tp.at(1).get<int>()};
      if (!info.tensor_parallel.valid())
        throw FormatError(cat("tensor-parallel rank ", info.tensor_parallel.rank, " of ", info.tensor_parallel.size,
                              " is not a rank of its group"));
    }
    if (!j.at("tokenizer").is_null()) impl->tokenizer = tokenizer_from(j.at("tokenizer"), where);
    j.at("data_offset").get_to(impl->data_offset);
    for (const auto& p : j.at("parts"))
      impl->parts.push_back({p.at(0).get<std::string>(), p.at(1).get<std::string>(), p.at(2).get<std::uint64_t>(),
                             p.at(3).get<std::uint64_t>()});
  } catch (const json::exception& e) {
    throw FormatError(cat(where, ": the header is not what format version ", version, " writes: ", e.what()));
  } catch (const Error& e) {
    throw FormatError(cat(where, ": the header holds an invalid value: ", e.what()));
  }
  const std::uint64_t data_bytes = j.at("data_bytes").get<std::uint64_t>();
  if (impl->data_offset < kPreamble + header_len || impl->data_offset % kAlign != 0)
    throw FormatError(cat(where, ": the data section's offset ", impl->data_offset, " is not past the header on a page"));
  if (all.size() < impl->data_offset + data_bytes)
    throw FormatError(cat(where, " is truncated: ", all.size(), " bytes, its header says ", impl->data_offset + data_bytes));
  for (std::size_t i = 0; i < impl->parts.size(); ++i) {
    const auto& p = impl->parts[i];
    if (p.offset % kAlign != 0 || p.offset > data_bytes || p.bytes > data_bytes - p.offset)
      throw FormatError(cat(where, ": part '", p.name, "' (", p.bytes, " bytes at ", p.offset,
                            ") lies outside the data section of ", data_bytes, " bytes"));
    if (!impl->index.emplace(p.name, i).second) throw FormatError(cat(where, ": part '", p.name, "' is listed twice"));
  }
  return EngineFile(std::move(impl));
}

const EngineFileInfo& EngineFile::info() const noexcept { return impl_->info; }
const std::optional<TokenizerSpec>& EngineFile::tokenizer() const noexcept { return impl_->tokenizer; }
const std::vector<EngineFilePart>& EngineFile::parts() const noexcept { return impl_->parts; }
const std::filesystem::path& EngineFile::path() const noexcept { return impl_->path; }

std::span<const std::byte> EngineFile::part(std::string_view name, std::string_view dtype) const {
  const auto it = impl_->index.find(name);
  if (it == impl_->index.end())
    throw FormatError(cat("engine file '", impl_->path.string(), "' has no part '", name, "' (built with quantizer ",
                          impl_->info.quantizer_layout, ")"));
  const EngineFilePart& p = impl_->parts[it->second];
  if (p.dtype != dtype)
    throw FormatError(cat("engine file '", impl_->path.string(), "': part '", name, "' holds ", p.dtype,
                          " values; this engine's layout needs ", dtype));
  return impl_->file->bytes().subspan(impl_->data_offset + p.offset, p.bytes);
}

void EngineFile::require_quantizer_layout(std::string_view layout) const {
  const EngineFileInfo& i = info();
  if (i.quantizer_layout != layout)
    throw FormatError(detail::cat("engine file '", path().string(), "' holds weights of quantizer ", i.quantizer_layout,
                                  "; this engine's is ", layout, " (load it with --quantizer ", i.quantizer,
                                  ", or rebuild it)"));
}

std::int64_t EngineFile::scalar(std::string_view name) const {
  const auto it = impl_->info.scalars.find(std::string(name));
  if (it == impl_->info.scalars.end())
    throw FormatError(cat("engine file '", impl_->path.string(), "' has no scalar '", name, "'"));
  return it->second;
}

// ---- writing

void EngineFileWriter::add_part(std::string name, std::string_view dtype, std::span<const std::byte> bytes) {
  parts_.push_back({std::move(name), std::string(dtype), bytes});
}

void EngineFileWriter::add_scalar(std::string name, std::int64_t value) { scalars_[std::move(name)] = value; }

std::uint64_t EngineFileWriter::write(const std::filesystem::path& path, EngineFileInfo info,
                                      const std::optional<TokenizerSpec>& tokenizer) const {
  std::set<std::string_view> seen;
  json table = json::array();
  std::vector<std::uint64_t> offsets;
  std::uint64_t end = 0;
  for (const auto& p : parts_) {
    require<InvalidArgument>(seen.insert(p.name).second, "EngineFileWriter: part '", p.name, "' was added twice");
    const std::uint64_t off = align_up(end);
    offsets.push_back(off);
    table.push_back({p.name, p.dtype, off, p.bytes.size()});
    end = off + p.bytes.size();
  }
  info.format_version = kEngineFileVersion;
  for (const auto& [k, v] : scalars_) info.scalars[k] = v;
  json j = {{"library_version", info.library_version},
            {"backend", info.backend},
            {"architecture", info.architecture},
            {"engine", info.engine},
            {"block_size", info.block_size},
            {"quantizer", info.quantizer},
            {"quantizer_layout", info.quantizer_layout},
            {"engine_options", options_json(info.engine_options)},
            {"config", config_json(info.config)},
            {"model", info.model},
            {"model_name", info.model_name},
            {"gemm_algorithms", info.gemm_algorithms},
            {"scalars", info.scalars},
            {"kv_cache_scales", info.kv_cache_scales},
            {"tensor_parallel", {info.tensor_parallel.rank, info.tensor_parallel.size}},
            {"tokenizer", tokenizer ? tokenizer_json(*tokenizer) : json(nullptr)},
            {"parts", std::move(table)},
            {"data_bytes", end},
            {"data_offset", 0}};
  // The data offset depends on the header's length, which depends on the offset's digits: settle it.
  std::string header;
  std::uint64_t data_offset = 0;
  for (;;) {
    j["data_offset"] = data_offset;
    header = j.dump();
    const std::uint64_t need = align_up(kPreamble + header.size());
    if (need == data_offset) break;
    data_offset = need;
  }
  std::array<std::byte, kPreamble> pre{};
  std::memcpy(pre.data(), kMagic.data(), kMagic.size());
  put_le<std::uint32_t>(pre.data() + 8, kEngineFileVersion);
  put_le<std::uint32_t>(pre.data() + 12, 0);
  put_le<std::uint64_t>(pre.data() + 16, header.size());
  put_le<std::uint64_t>(pre.data() + 24, fnv1a64(std::as_bytes(std::span<const char>(header))));

  const std::filesystem::path tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(cat("cannot write engine file '", tmp.string(), "': ", std::strerror(errno)));
    const std::vector<char> zeros(kAlign, 0);
    auto pad_to = [&](std::uint64_t at, std::uint64_t target) {
      while (at < target) {
        const auto n = static_cast<std::streamsize>(std::min<std::uint64_t>(kAlign, target - at));
        out.write(zeros.data(), n);
        at += static_cast<std::uint64_t>(n);
      }
    };
    out.write(reinterpret_cast<const char*>(pre.data()), static_cast<std::streamsize>(pre.size()));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    pad_to(kPreamble + header.size(), data_offset);
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      pad_to(at, offsets[i]);
      out.write(reinterpret_cast<const char*>(parts_[i].bytes.data()), static_cast<std::streamsize>(parts_[i].bytes.size()));
      at = offsets[i] + parts_[i].bytes.size();
    }
    out.flush();
    if (!out) {
      const int err = errno;
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw IoError(cat("writing engine file '", tmp.string(), "' failed: ", std::strerror(err)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError(cat("cannot move '", tmp.string(), "' to '", path.string(), "': ", ec.message()));
  return data_offset + end;
}

std::string engine_file_architecture(std::string_view backend) {
  if (backend == "cpu") return "cpu";
  if (backend != "cuda") return std::string(backend);
#if defined(INFER_HAVE_CUDA)
  if (backend::cuda::device_count() == 0) return "no cuda device";
  return backend::cuda::device_architecture();
#else
  return "no cuda in this build";
#endif
}

}  // namespace infer
