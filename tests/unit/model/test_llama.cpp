// The Llama-family decoder on the CPU, on tiny random models written by the test itself — as a Hugging
// Face folder (config.json + model.safetensors) and as GGUF (llama: q/k rows permuted the way
// llama.cpp's converter does, interleaved RoPE; qwen2: neox, biases) — against a double-precision
// reference forward pass written here from the formulas. Also: chunk invariance, batch invariance,
// paged vs contiguous attention, NaN-poisoned caches, ModelSource's role mapping, KvCache, and errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "infer/attention/contiguous_attention.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/core/half.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/f32.hpp"
#include "support/gguf_writer.hpp"

using namespace infer;
namespace fs = std::filesystem;

namespace {

using PagedModel = LlamaModel<cpu, F32, PagedAttention<>>;
using ContigModel = LlamaModel<cpu, F32, FusedContiguousAttention<>>;
static_assert(std::is_same_v<llama::decoder<cpu, F32, PagedAttention<>>, PagedModel>);

// ---- a tiny random model ------------------------------------------------------------------------------

struct Spec {
  std::string model_type = "llama";  ///< llama, qwen2 or mistral
  int vocab = 100, hidden = 64, inter = 128, layers = 2, heads = 4, kv_heads = 2;
  bool tied = false;
  bool bias = false;  ///< q/k/v biases (qwen2)
  float theta = 10000.0f, eps = 1e-5f;
  int sliding_window = 0;  ///< mistral only; 0 = none
  int head_dim() const { return hidden / heads; }
  int q_size() const { return heads * head_dim(); }
  int kv_size() const { return kv_heads * head_dim(); }
};

/// HF layout ([out][in] row-major, q/k rows in HF's order).
struct Weights {
  std::vector<float> embed, norm, lm_head;
  struct Layer {
    std::vector<float> attn_norm, q, k, v, o, qb, kb, vb, ffn_norm, gate, up, down;
  };
  std::vector<Layer> layers;
};

float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

Weights make_weights(const Spec& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  auto linear = [&](int out, int in) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(static_cast<std::size_t>(out) * in);
    for (auto& x : w) x = u(rng) / std::sqrt(static_cast<float>(in)) * 1.5f;
    return w;
  };
  auto vec = [&](int n, float mean, float sd) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = mean + sd * n01(rng);
    return v;
  };
  Weights w;
  w.embed = vec(s.vocab * s.hidden, 0.0f, 1.0f);
  w.norm = vec(s.hidden, 1.0f, 0.1f);
  if (!s.tied) w.lm_head = linear(s.vocab, s.hidden);
  for (int l = 0; l < s.layers; ++l) {
    Weights::Layer L;
    L.attn_norm = vec(s.hidden, 1.0f, 0.1f);
    L.q = linear(s.q_size(), s.hidden);
    L.k = linear(s.kv_size(), s.hidden);
    L.v = linear(s.kv_size(), s.hidden);
    L.o = linear(s.hidden, s.q_size());
    if (s.bias) {
      L.qb = vec(s.q_size(), 0.0f, 0.5f);
      L.kb = vec(s.kv_size(), 0.0f, 0.5f);
      L.vb = vec(s.kv_size(), 0.0f, 0.5f);
    }
    L.ffn_norm = vec(s.hidden, 1.0f, 0.1f);
    L.gate = linear(s.inter, s.hidden);
    for (auto& x : L.gate) x = round_bf16(x);  // stored as bf16 in the safetensors file
    L.up = linear(s.inter, s.hidden);
    L.down = linear(s.hidden, s.inter);
    for (auto& x : L.down) x = round_f16(x);  // stored as f16 in the GGUF file
    w.layers.push_back(std::move(L));
  }
  return w;
}

/// A scratch folder removed when the test program ends.
const fs::path& temp_root() {
  struct Dir {
    fs::path p;
    Dir() {
      std::random_device rd;
      p = fs::temp_directory_path() / ("infer_test_llama_" + std::to_string(rd()));
      fs::create_directories(p);
    }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  };
  static const Dir d;
  return d.p;
}

void write_bytes(const fs::path& p, const void* data, std::size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  REQUIRE(out.good());
}

/// config.json + model.safetensors (gate as BF16, the rest F32).
fs::path write_hf(const std::string& name, const Spec& s, const Weights& w) {
  const fs::path dir = temp_root() / name;
  fs::create_directories(dir);
  nlohmann::json cfg = {{"model_type", s.model_type},
                        {"architectures", {s.model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                        {"vocab_size", s.vocab},
                        {"hidden_size", s.hidden},
                        {"intermediate_size", s.inter},
                        {"num_hidden_layers", s.layers},
                        {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.kv_heads},
                        {"max_position_embeddings", 256},
                        {"rms_norm_eps", s.eps},
                        {"rope_theta", s.theta},
                        {"tie_word_embeddings", s.tied},
                        {"hidden_act", "silu"},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2}};
  if (s.model_type == "mistral") cfg["sliding_window"] = s.sliding_window ? nlohmann::json(s.sliding_window) : nullptr;
  const std::string cfg_text = cfg.dump(2);
  write_bytes(dir / "config.json", cfg_text.data(), cfg_text.size());

  struct T {
    std::vector<std::uint64_t> shape;
    const std::vector<float>* v;
    bool bf16;
  };
  std::map<std::string, T> ts;
  auto u = [](int x) { return static_cast<std::uint64_t>(x); };
  ts["model.embed_tokens.weight"] = {{u(s.vocab), u(s.hidden)}, &w.embed, false};
  ts["model.norm.weight"] = {{u(s.hidden)}, &w.norm, false};
  if (!s.tied) ts["lm_head.weight"] = {{u(s.vocab), u(s.hidden)}, &w.lm_head, false};
  for (int l = 0; l < s.layers; ++l) {
    const auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts[p + "input_layernorm.weight"] = {{u(s.hidden)}, &L.attn_norm, false};
    ts[p + "self_attn.q_proj.weight"] = {{u(s.q_size()), u(s.hidden)}, &L.q, false};
    ts[p + "self_attn.k_proj.weight"] = {{u(s.kv_size()), u(s.hidden)}, &L.k, false};
    ts[p + "self_attn.v_proj.weight"] = {{u(s.kv_size()), u(s.hidden)}, &L.v, false};
    ts[p + "self_attn.o_proj.weight"] = {{u(s.hidden), u(s.q_size())}, &L.o, false};
    if (s.bias) {
      ts[p + "self_attn.q_proj.bias"] = {{u(s.q_size())}, &L.qb, false};
      ts[p + "self_attn.k_proj.bias"] = {{u(s.kv_size())}, &L.kb, false};
      ts[p + "self_attn.v_proj.bias"] = {{u(s.kv_size())}, &L.vb, false};
    }
    ts[p + "post_attention_layernorm.weight"] = {{u(s.hidden)}, &L.ffn_norm, false};
    ts[p + "mlp.gate_proj.weight"] = {{u(s.inter), u(s.hidden)}, &L.gate, true};
    ts[p + "mlp.up_proj.weight"] = {{u(s.inter), u(s.hidden)}, &L.up, false};
    ts[p + "mlp.down_proj.weight"] = {{u(s.hidden), u(s.inter)}, &L.down, false};
  }
  nlohmann::json header = nlohmann::json::object();
  std::vector<std::byte> data;
  for (const auto& [n, t] : ts) {
    const std::size_t begin = data.size();
    for (float x : *t.v) {
      if (t.bf16) {
        const std::uint16_t b = f32_to_bf16(x);
        data.push_back(static_cast<std::byte>(b & 0xff));
        data.push_back(static_cast<std::byte>(b >> 8));
      } else {
        std::byte b[4];
        std::memcpy(b, &x, 4);
        data.insert(data.end(), b, b + 4);
      }
    }
    header[n] = {{"dtype", t.bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::vector<std::byte> file(8);
  const std::uint64_t hn = h.size();
  std::memcpy(file.data(), &hn, 8);
  for (char c : h) file.push_back(static_cast<std::byte>(c));
  file.insert(file.end(), data.begin(), data.end());
  write_bytes(dir / "model.safetensors", file.data(), file.size());
  return dir;
}

/// llama.cpp's q/k permutation: within each head, new row 2i + j = old row j * D/2 + i.
std::vector<float> permute_rows(const std::vector<float>& w, int heads, int head_dim, int in) {
  std::vector<float> out(w.size());
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        std::copy_n(&w[static_cast<std::size_t>(h * head_dim + j * half + i) * in], in,
                    &out[static_cast<std::size_t>(h * head_dim + 2 * i + j) * in]);
  return out;
}

/// The same model as GGUF: arch llama (permuted q/k) or qwen2; ffn_down as F16.
/// `wrong_k_shape` writes blk.1.attn_k with its dimensions swapped (same bytes, wrong shape).
fs::path write_gguf(const std::string& name, const Spec& s, const Weights& w, bool wrong_k_shape = false) {
  const std::string arch = s.model_type == "qwen2" ? "qwen2" : "llama";
  test::GgufWriter g;
  auto u32 = [](int x) { return static_cast<std::uint32_t>(x); };
  g.add("general.architecture", gguf::Value{std::string(arch)});
  g.add(arch + ".block_count", gguf::Value{u32(s.layers)});
  g.add(arch + ".context_length", gguf::Value{u32(256)});
  g.add(arch + ".embedding_length", gguf::Value{u32(s.hidden)});
  g.add(arch + ".feed_forward_length", gguf::Value{u32(s.inter)});
  g.add(arch + ".attention.head_count", gguf::Value{u32(s.heads)});
  g.add(arch + ".attention.head_count_kv", gguf::Value{u32(s.kv_heads)});
  g.add(arch + ".attention.layer_norm_rms_epsilon", gguf::Value{s.eps});
  g.add(arch + ".rope.freq_base", gguf::Value{s.theta});
  g.add(arch + ".vocab_size", gguf::Value{u32(s.vocab)});
  auto u = [](int x) { return static_cast<std::uint64_t>(x); };
  const bool permute = arch == "llama";
  g.tensor_f32("token_embd.weight", {u(s.hidden), u(s.vocab)}, w.embed);
  g.tensor_f32("output_norm.weight", {u(s.hidden)}, w.norm);
  if (!s.tied) g.tensor_f32("output.weight", {u(s.hidden), u(s.vocab)}, w.lm_head);
  for (int l = 0; l < s.layers; ++l) {
    const auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    g.tensor_f32(p + "attn_norm.weight", {u(s.hidden)}, L.attn_norm);
    g.tensor_f32(p + "attn_q.weight", {u(s.hidden), u(s.q_size())},
                 permute ? permute_rows(L.q, s.heads, s.head_dim(), s.hidden) : L.q);
    const bool swap = wrong_k_shape && l == 1;
    g.tensor_f32(p + "attn_k.weight", {swap ? u(s.kv_size()) : u(s.hidden), swap ? u(s.hidden) : u(s.kv_size())},
                 permute ? permute_rows(L.k, s.kv_heads, s.head_dim(), s.hidden) : L.k);
    g.tensor_f32(p + "attn_v.weight", {u(s.hidden), u(s.kv_size())}, L.v);
    g.tensor_f32(p + "attn_output.weight", {u(s.q_size()), u(s.hidden)}, L.o);
    if (s.bias) {
      g.tensor_f32(p + "attn_q.bias", {u(s.q_size())}, L.qb);
      g.tensor_f32(p + "attn_k.bias", {u(s.kv_size())}, L.kb);
      g.tensor_f32(p + "attn_v.bias", {u(s.kv_size())}, L.vb);
    }
    g.tensor_f32(p + "ffn_norm.weight", {u(s.hidden)}, L.ffn_norm);
    g.tensor_f32(p + "ffn_gate.weight", {u(s.hidden), u(s.inter)}, L.gate);
    g.tensor_f32(p + "ffn_up.weight", {u(s.hidden), u(s.inter)}, L.up);
    std::vector<std::byte> down;
    for (float x : L.down) {
      const std::uint16_t h = f32_to_f16(x);
      down.push_back(static_cast<std::byte>(h & 0xff));
      down.push_back(static_cast<std::byte>(h >> 8));
    }
    g.tensor(p + "ffn_down.weight", 1, {u(s.inter), u(s.hidden)}, std::move(down));
  }
  const auto bytes = g.build();
  const fs::path path = temp_root() / (name + ".gguf");
  write_bytes(path, bytes.data(), bytes.size());
  return path;
}

// ---- the reference: the decoder's formulas in double, HF layout, neox RoPE ----------------------------

std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x, int out) {
  const int in = static_cast<int>(x.size());
  std::vector<double> y(static_cast<std::size_t>(out));
  for (int o = 0; o < out; ++o) {
    double s = 0;
    for (int i = 0; i < in; ++i) s += w[static_cast<std::size_t>(o) * in + i] * x[i];
    y[o] = s;
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

/// Logits at every position of `tokens`, [n][vocab]. `use_bias` false drops the q/k/v biases.
std::vector<std::vector<double>> reference(const Spec& s, const Weights& w, const ModelConfig& cfg,
                                           const std::vector<std::int32_t>& tokens, bool use_bias = true) {
  const int n = static_cast<int>(tokens.size()), D = s.head_dim(), G = s.heads / s.kv_heads, half = D / 2;
  const auto inv_freq = rope_inv_freq(cfg);
  std::vector<std::vector<double>> x(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t)
    x[t].assign(w.embed.begin() + tokens[t] * s.hidden, w.embed.begin() + (tokens[t] + 1) * s.hidden);
  auto rope = [&](std::vector<double>& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double a = pos * static_cast<double>(inv_freq[i]);
        double& x0 = v[h * D + i];
        double& x1 = v[h * D + i + half];
        const double a0 = x0, b0 = x1;
        x0 = a0 * std::cos(a) - b0 * std::sin(a);
        x1 = a0 * std::sin(a) + b0 * std::cos(a);
      }
  };
  for (const auto& L : w.layers) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[t], L.attn_norm, s.eps);
      q[t] = matvec(L.q, xn, s.q_size());
      k[t] = matvec(L.k, xn, s.kv_size());
      v[t] = matvec(L.v, xn, s.kv_size());
      if (s.bias && use_bias) {
        for (int i = 0; i < s.q_size(); ++i) q[t][i] += L.qb[i];
        for (int i = 0; i < s.kv_size(); ++i) k[t][i] += L.kb[i], v[t][i] += L.vb[i];
      }
      rope(q[t], s.heads, t);
      rope(k[t], s.kv_heads, t);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(static_cast<std::size_t>(s.q_size()), 0.0);
      for (int h = 0; h < s.heads; ++h) {
        const int g = h / G;
        std::vector<double> sc(static_cast<std::size_t>(t + 1));
        for (int p = 0; p <= t; ++p) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][h * D + i] * k[p][g * D + i];
          sc[p] = d / std::sqrt(static_cast<double>(D));
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (auto& e : sc) sum += (e = std::exp(e - mx));
        for (int p = 0; p <= t; ++p)
          for (int i = 0; i < D; ++i) att[h * D + i] += sc[p] / sum * v[p][g * D + i];
      }
      const auto o = matvec(L.o, att, s.hidden);
      for (int i = 0; i < s.hidden; ++i) x[t][i] += o[i];
      const auto xn = rmsnorm(x[t], L.ffn_norm, s.eps);
      auto gate = matvec(L.gate, xn, s.inter);
      const auto up = matvec(L.up, xn, s.inter);
      for (int i = 0; i < s.inter; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const auto down = matvec(L.down, gate, s.hidden);
      for (int i = 0; i < s.hidden; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<double>> logits(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) logits[t] = matvec(s.tied ? w.embed : w.lm_head, rmsnorm(x[t], w.norm, s.eps), s.vocab);
  return logits;
}

// ---- running the model ----------------------------------------------------------------------------

std::vector<std::int32_t> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> d(0, vocab - 1);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

KvCache<cpu> paged_cache(const ModelConfig& c, std::int32_t blocks = 40, std::int32_t block_size = 4) {
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), blocks, block_size,
                     static_cast<std::int32_t>(c.num_kv_heads), static_cast<std::int32_t>(c.head_dim));
  cache.poison();  // every slot the model did not write is NaN: reading one shows in the logits
  return cache;
}

/// A scrambled block table: blocks (7 * i + first) mod 40.
std::vector<std::int32_t> scrambled_table(int n, int first) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((7 * i + first) % 40);
  return t;
}

/// Feeds `tokens` in chunks of `chunk` tokens; returns the logits of every chunk's last position
/// (every chunk samples), [chunks][vocab].
template <class Model>
std::vector<std::vector<float>> run(Model& m, KvCache<cpu>& cache, const std::vector<std::int32_t>& tokens,
                                    std::span<const std::int32_t> table, int chunk) {
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  for (std::size_t s = 0; s < tokens.size(); s += static_cast<std::size_t>(chunk)) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), tokens.size() - s);
    const ForwardChunk c{std::span(tokens).subspan(s, n), static_cast<std::int32_t>(s), table, true};
    m.forward(std::span(&c, 1), cache, logits);
    REQUIRE(logits.size() == static_cast<std::size_t>(m.config().vocab_size));
    out.push_back(logits);
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}
double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    d = std::max(d, std::abs(a[i] - b[i]));
  }
  return d;
}

struct Fixture {
  Spec spec;
  Weights w;
  fs::path hf, gguf;
};

const Fixture& llama_fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.w = make_weights(x.spec, 42);
    x.hf = write_hf("llama_hf", x.spec, x.w);
    x.gguf = write_gguf("llama", x.spec, x.w);
    return x;
  }();
  return f;
}

const Fixture& qwen2_fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.spec.model_type = "qwen2";
    x.spec.bias = true;
    x.spec.tied = true;
    x.spec.kv_heads = 1;
    x.w = make_weights(x.spec, 43);
    x.hf = write_hf("qwen2_hf", x.spec, x.w);
    x.gguf = write_gguf("qwen2", x.spec, x.w);
    return x;
  }();
  return f;
}

}  // namespace

// ---- tests ------------------------------------------------------------------------------------------

TEST_CASE("HF llama folder: logits at every position equal the double-precision reference", "[model][llama]") {
  const auto& f = llama_fixture();
  const auto src = ModelSource::open(f.hf);
  auto model = PagedModel::load(src);
  CHECK(model.config().rope_style == RopeStyle::neox);
  CHECK(model.kv_bytes_per_token() == 2u * 2 * 32 * sizeof(float));
  const auto tokens = random_tokens(19, f.spec.vocab, 1);
  const auto want = reference(f.spec, f.w, src.config(), tokens);
  auto cache = paged_cache(model.config());
  const auto table = scrambled_table(5, 3);
  const auto got = run(model, cache, tokens, table, 1);  // decode: logits at every position
  double worst = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t) worst = std::max(worst, max_diff(got[t], want[t]));
  INFO("largest |logit - reference| = " << worst);
  CHECK(worst < 1e-4);
  // The logits are not trivially small: the bound above means something.
  CHECK(*std::max_element(want.back().begin(), want.back().end()) > 1.0);
}

TEST_CASE("GGUF llama (permuted q/k, interleaved RoPE, an f16 tensor) equals the HF folder", "[model][llama][gguf]") {
  const auto& f = llama_fixture();
  const auto hf_src = ModelSource::open(f.hf);
  const auto gg_src = ModelSource::open(f.gguf);
  CHECK(gg_src.config().rope_style == RopeStyle::interleaved);
  auto hf = PagedModel::load(hf_src);
  auto gg = PagedModel::load(gg_src);
  const auto tokens = random_tokens(12, f.spec.vocab, 2);
  auto c1 = paged_cache(hf.config());
  auto c2 = paged_cache(gg.config());
  const auto table = scrambled_table(3, 0);
  const auto a = run(hf, c1, tokens, table, 5);
  const auto b = run(gg, c2, tokens, table, 5);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_diff(a[i], b[i]) < 1e-5);
}

TEST_CASE("chunk invariance: one chunk, chunks of 3 and token-by-token decode agree", "[model][llama]") {
  const auto& f = llama_fixture();
  const auto src = ModelSource::open(f.gguf);
  auto model = PagedModel::load(src);
  const auto tokens = random_tokens(13, f.spec.vocab, 3);
  const auto table = scrambled_table(4, 5);
  auto c1 = paged_cache(model.config()), c3 = paged_cache(model.config()), cd = paged_cache(model.config());
  const auto whole = run(model, c1, tokens, table, 13).back();
  const auto by3 = run(model, c3, tokens, table, 3).back();
  const auto decode = run(model, cd, tokens, table, 1).back();
  CHECK(max_diff(whole, by3) < 1e-5);
  CHECK(max_diff(whole, decode) < 1e-5);
  const auto want = reference(f.spec, f.w, src.config(), tokens).back();
  CHECK(max_diff(whole, want) < 1e-4);
}

TEST_CASE("batch invariance: sequences in one forward equal each alone", "[model][llama]") {
  const auto& f = llama_fixture();
  auto model = PagedModel::load(ModelSource::open(f.gguf));
  const auto a = random_tokens(10, f.spec.vocab, 4), b = random_tokens(7, f.spec.vocab, 5);
  const auto ta = scrambled_table(3, 1), tb = scrambled_table(3, 2);  // disjoint: blocks 1,8,15 / 2,9,16

  // Alone: A's prefill of 9 then a decode of its 10th; B's prefill of 3 then 4 more.
  auto ca = paged_cache(model.config()), cb = paged_cache(model.config());
  std::vector<float> la1, la2, lb1, lb2;
  auto one = [&](KvCache<cpu>& cache, const std::vector<std::int32_t>& t, std::size_t s, std::size_t n,
                 std::span<const std::int32_t> table, std::vector<float>& out) {
    const ForwardChunk c{std::span(t).subspan(s, n), static_cast<std::int32_t>(s), table, true};
    model.forward(std::span(&c, 1), cache, out);
  };
  one(ca, a, 0, 9, ta, la1);
  one(ca, a, 9, 1, ta, la2);
  one(cb, b, 0, 3, tb, lb1);
  one(cb, b, 3, 4, tb, lb2);

  // Together, in one cache: step 1 = A's prefill + B's first chunk (which does not sample);
  // step 2 = A's decode + B's second chunk.
  auto cache = paged_cache(model.config());
  std::vector<float> l1, l2;
  const ForwardChunk step1[] = {{std::span(a).subspan(0, 9), 0, ta, true}, {std::span(b).subspan(0, 3), 0, tb, false}};
  model.forward(step1, cache, l1);
  REQUIRE(l1.size() == static_cast<std::size_t>(f.spec.vocab));
  CHECK(max_diff(l1, la1) < 1e-5);
  const ForwardChunk step2[] = {{std::span(a).subspan(9, 1), 9, ta, true}, {std::span(b).subspan(3, 4), 3, tb, true}};
  model.forward(step2, cache, l2);
  REQUIRE(l2.size() == 2u * f.spec.vocab);
  CHECK(max_diff(std::vector<float>(l2.begin(), l2.begin() + f.spec.vocab), la2) < 1e-5);
  CHECK(max_diff(std::vector<float>(l2.begin() + f.spec.vocab, l2.end()), lb2) < 1e-5);

  // A step with no sampling chunk gives no logits.
  const ForwardChunk none[] = {{std::span(b).subspan(0, 2), 0, tb, false}};
  model.forward(none, cache, l2);
  CHECK(l2.empty());
}

TEST_CASE("paged and contiguous attention give the same logits", "[model][llama]") {
  const auto& f = llama_fixture();
  const auto src = ModelSource::open(f.gguf);
  auto paged = PagedModel::load(src);
  auto contig = ContigModel::load(src);
  const auto tokens = random_tokens(11, f.spec.vocab, 6);
  auto pc = paged_cache(paged.config());
  KvCache<cpu> cc(2, 3, 16, 2, 16);  // 3 slots of 16 tokens
  cc.poison();
  const auto table = scrambled_table(3, 4);
  const std::vector<std::int32_t> slot = {2};
  const auto a = run(paged, pc, tokens, table, 4);
  const auto b = run(contig, cc, tokens, slot, 4);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_diff(a[i], b[i]) < 1e-6);
  // Past the slot's capacity is an error, not a write into the next slot.
  std::vector<float> logits;
  const std::vector<std::int32_t> more = random_tokens(6, f.spec.vocab, 7);
  const ForwardChunk c{more, 11, slot, true};
  CHECK_THROWS_AS(contig.forward(std::span(&c, 1), cc, logits), InvalidArgument);
}

TEST_CASE("Qwen2: q/k/v biases are used, the GGUF (tied, neox) equals the HF folder", "[model][qwen2]") {
  const auto& f = qwen2_fixture();
  const auto hf_src = ModelSource::open(f.hf);
  const auto gg_src = ModelSource::open(f.gguf);
  REQUIRE(hf_src.config().attention_bias);
  REQUIRE(gg_src.config().attention_bias);
  CHECK(gg_src.config().tie_word_embeddings);
  CHECK(gg_src.config().rope_style == RopeStyle::neox);
  auto hf = PagedModel::load(hf_src);
  auto gg = PagedModel::load(gg_src);
  const auto tokens = random_tokens(9, f.spec.vocab, 8);
  const auto table = scrambled_table(3, 6);
  auto c1 = paged_cache(hf.config()), c2 = paged_cache(gg.config());
  const auto a = run(hf, c1, tokens, table, 4).back();
  const auto b = run(gg, c2, tokens, table, 9).back();
  const auto want = reference(f.spec, f.w, hf_src.config(), tokens).back();
  const auto no_bias = reference(f.spec, f.w, hf_src.config(), tokens, false).back();
  CHECK(max_diff(a, want) < 1e-4);
  CHECK(max_diff(b, want) < 1e-4);
  CHECK(max_diff(a, no_bias) > 1e-2);  // dropping the biases would be caught
}

TEST_CASE("Mistral: a sliding window the sequence exceeds is refused, not ignored", "[model][llama]") {
  Spec s;
  s.model_type = "mistral";
  s.sliding_window = 8;
  const auto w = make_weights(s, 44);
  auto model = PagedModel::load(ModelSource::open(write_hf("mistral_hf", s, w)));
  auto cache = paged_cache(model.config());
  const auto tokens = random_tokens(9, s.vocab, 9);
  const auto table = scrambled_table(3, 0);
  std::vector<float> logits;
  const ForwardChunk ok{std::span(tokens).subspan(0, 8), 0, table, true};
  model.forward(std::span(&ok, 1), cache, logits);
  CHECK(max_diff(logits, reference(s, w, model.config(), std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 8))
                             .back()) < 1e-4);
  const ForwardChunk beyond{std::span(tokens).subspan(8, 1), 8, table, true};
  CHECK_THROWS_AS(model.forward(std::span(&beyond, 1), cache, logits), UnsupportedError);
}

TEST_CASE("forward rejects bad chunks before writing anything", "[model][llama]") {
  const auto& f = llama_fixture();
  auto model = PagedModel::load(ModelSource::open(f.gguf));
  auto cache = paged_cache(model.config());
  const auto table = scrambled_table(2, 0);
  std::vector<float> logits;
  auto fails = [&](std::vector<std::int32_t> tokens, std::int32_t start, std::span<const std::int32_t> t,
                   const char* needle) {
    const ForwardChunk c{tokens, start, t, true};
    try {
      model.forward(std::span(&c, 1), cache, logits);
      FAIL("no error for " << needle);
    } catch (const InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains(needle));
    }
  };
  fails({5, 100}, 0, table, "outside the vocabulary");
  fails({5, -1}, 0, table, "outside the vocabulary");
  fails({}, 0, table, "no tokens");
  fails({1, 2, 3}, 6, table, "block table");  // positions 6..8 need 3 blocks of 4
  const std::vector<std::int32_t> bad_block = {0, 40};
  fails({1, 2, 3}, 4, bad_block, "outside the cache");
  fails({1}, -1, table, "starts at");
  // Nothing was written: the cache is still all NaN.
  for (std::int32_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < 40u * 4 * 32; ++i) REQUIRE(std::isnan(cache.k(l)[i]));
  // A cache of another shape.
  KvCache<cpu> other(2, 4, 4, 4, 16);
  const std::vector<std::int32_t> one = {1};
  const ForwardChunk c{one, 0, table, true};
  CHECK_THROWS_AS(model.forward(std::span(&c, 1), other, logits), InvalidArgument);
}

TEST_CASE("ModelSource maps canonical roles onto both formats", "[model][source]") {
  const auto& f = llama_fixture();
  const auto hf = ModelSource::open(f.hf);
  const auto gg = ModelSource::open(f.gguf);
  CHECK(hf.describe() == "safetensors folder '" + f.hf.string() + "'");
  CHECK(gg.describe() == "GGUF '" + f.gguf.string() + "'");
  CHECK(hf.tokenizer() == nullptr);
  CHECK(gg.tokenizer() == nullptr);
  CHECK(hf.file_name("blk.1.attn_q") == "model.layers.1.self_attn.q_proj.weight");
  CHECK(hf.file_name("blk.0.ffn_norm") == "model.layers.0.post_attention_layernorm.weight");
  CHECK(hf.file_name("output") == "lm_head.weight");
  CHECK(gg.file_name("blk.1.attn_k.bias") == "blk.1.attn_k.bias");
  CHECK(gg.file_name("token_embd") == "token_embd.weight");
  for (const char* role : {"token_embd", "output", "blk.1.attn_q", "blk.0.attn_output", "blk.1.ffn_down"}) {
    INFO(role);
    const auto a = hf.get(role), b = gg.get(role);
    CHECK(a.shape == b.shape);  // GGUF's dimensions arrive reversed into [out, in]
  }
  CHECK(hf.get("blk.0.attn_q").shape == std::vector<std::uint64_t>{64, 64});
  CHECK(hf.get("blk.0.attn_k").shape == std::vector<std::uint64_t>{32, 64});
  CHECK(gg.get("blk.0.ffn_down").shape == std::vector<std::uint64_t>{64, 128});
  CHECK(gg.get("blk.0.ffn_down").type == DType::f16);
  CHECK(hf.get("blk.0.ffn_gate").type == DType::bf16);
  CHECK_FALSE(hf.find("blk.0.attn_q.bias"));
  CHECK_FALSE(gg.find("blk.2.attn_q"));
  try {
    (void)hf.get("blk.7.ffn_up");
    FAIL("no error");
  } catch (const NotFoundError& e) {
    CHECK_THAT(e.what(), Catch::Contains("blk.7.ffn_up") && Catch::Contains("model.layers.7.mlp.up_proj.weight") &&
                             Catch::Contains(f.hf.string()));
  }
  for (const char* bad : {"blk.x.attn_q", "attn_q", "blk.0.attn_norm.bias", "blk.0.mlp", "token_embd.weight", "blk..attn_q"})
    CHECK_THROWS_AS(hf.find(bad), InvalidArgument);

  const auto q = ModelSource::open(qwen2_fixture().gguf);
  CHECK_FALSE(q.find("output"));  // tied
  CHECK_THROWS_WITH(q.get("output"), Catch::Contains("ties"));
  CHECK(q.find("blk.1.attn_v.bias"));
}

TEST_CASE("loading names a missing tensor or one of the wrong shape", "[model][source]") {
  Spec s;
  const fs::path bad_shape = write_gguf("bad_shape", s, make_weights(s, 45), true);
  try {
    (void)PagedModel::load(ModelSource::open(bad_shape));
    FAIL("no error");
  } catch (const FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("blk.1.attn_k.weight") && Catch::Contains("[64, 32]") &&
                             Catch::Contains("expected [32, 64]"));
  }
  Spec s1 = s;
  s1.layers = 1;  // file has one layer, config below claims two
  const fs::path dir = write_hf("missing", s1, make_weights(s1, 46));
  {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    cfg["num_hidden_layers"] = 2;
    const std::string text = cfg.dump();
    write_bytes(dir / "config.json", text.data(), text.size());
  }
  CHECK_THROWS_AS(PagedModel::load(ModelSource::open(dir)), NotFoundError);
}

TEST_CASE("KvCache: layout, copy_block across layers, poison, bad sizes", "[model][kv_cache]") {
  KvCache<cpu> c(3, 5, 4, 2, 8);
  CHECK(c.bytes() == 3u * 2 * 5 * 4 * 2 * 8 * sizeof(float));
  CHECK(c.num_blocks() == 5);
  CHECK(c.block_size() == 4);
  const std::size_t block = 4 * 2 * 8;
  for (std::int32_t l = 0; l < 3; ++l)
    for (std::size_t i = 0; i < block; ++i) {
      c.k(l)[1 * block + i] = static_cast<float>(l * 1000 + i);
      c.v(l)[1 * block + i] = -static_cast<float>(l * 1000 + i);
    }
  c.copy_block(1, 4);
  for (std::int32_t l = 0; l < 3; ++l)
    for (std::size_t i = 0; i < block; ++i) {
      REQUIRE(c.k(l)[4 * block + i] == static_cast<float>(l * 1000 + i));
      REQUIRE(c.v(l)[4 * block + i] == -static_cast<float>(l * 1000 + i));
      REQUIRE(c.k(l)[3 * block + i] == 0.0f);
    }
  CHECK(c.k(1) - c.k(0) == static_cast<std::ptrdiff_t>(2 * 5 * block));
  CHECK(c.v(0) - c.k(0) == static_cast<std::ptrdiff_t>(5 * block));
  CHECK_THROWS_AS(c.copy_block(0, 5), InvalidArgument);
  CHECK_THROWS_AS(c.copy_block(-1, 0), InvalidArgument);
  CHECK_THROWS_AS(c.k(3), InvalidArgument);
  c.poison();
  CHECK(std::isnan(c.v(2)[5 * block - 1]));
  CHECK_THROWS_AS(KvCache<cpu>(0, 5, 4, 2, 8), InvalidArgument);
  CHECK_THROWS_AS(KvCache<cpu>(2, 5, -4, 2, 8), InvalidArgument);
  CHECK_THROWS_AS(KvCache<cpu>(1 << 30, 1 << 30, 1 << 30, 1 << 30, 8), InvalidArgument);
}
