#pragma once
// GPTQ (AutoGPTQ v1, with and without act-order) and AWQ (GEMM) checkpoints of a layer, written from the
// formats' definitions (AutoGPTQ's pack: codes along the input, eight to an int32, zeros stored minus one; AWQ's
// GEMM pack: along the output in the order 0 2 4 6 1 3 5 7), not from another implementation's code. Shared by
// the Int4 loader's CPU tests and its GPU ones.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "infer/core/half.hpp"
#include "infer/quant/int4.hpp"
#include "support/safetensors_writer.hpp"

namespace infer::test {

enum class Packing { gptq, gptq_act_order, awq };

/// A layer quantized by Int4 (group 32), then written in `packing`; with act-order, inputs are assigned to
/// groups by a permutation (g_idx), as GPTQ's desc_act does.
struct PackedLayer {
  std::vector<std::int32_t> qweight, qzeros, g_idx;
  std::vector<std::uint16_t> scales;  ///< f16 [groups][out]
  std::vector<float> dequantized;     ///< [out][in]: what the loader must reproduce
};

inline PackedLayer pack(const std::vector<float>& w, std::int64_t out, std::int64_t in, Packing packing) {
  constexpr std::int64_t group = 32;
  const std::int64_t groups = in / group;
  std::vector<std::int32_t> group_of(static_cast<std::size_t>(in));
  for (std::int64_t i = 0; i < in; ++i) group_of[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / group);
  if (packing == Packing::gptq_act_order) std::shuffle(group_of.begin(), group_of.end(), std::mt19937(7));
  // Quantize by the permuted groups: gather each group's inputs, quantize, scatter back.
  std::vector<std::uint8_t> q(static_cast<std::size_t>(out * in));
  std::vector<float> s(static_cast<std::size_t>(groups * out)), z(s.size());
  for (std::int64_t g = 0; g < groups; ++g) {
    std::vector<std::int64_t> members;
    for (std::int64_t i = 0; i < in; ++i)
      if (group_of[static_cast<std::size_t>(i)] == g) members.push_back(i);
    std::vector<float> sub(static_cast<std::size_t>(out) * members.size());
    for (std::int64_t o = 0; o < out; ++o)
      for (std::size_t m = 0; m < members.size(); ++m)
        sub[static_cast<std::size_t>(o) * members.size() + m] = w[static_cast<std::size_t>(o * in + members[m])];
    const auto l = Int4::quantize(sub, out, static_cast<std::int64_t>(members.size()), static_cast<std::int64_t>(members.size()));
    for (std::int64_t o = 0; o < out; ++o) {
      // Scales go through f16 in the file: round them here so the expected values use what is stored.
      s[static_cast<std::size_t>(g * out + o)] = f16_to_f32(f32_to_f16(l.scale[static_cast<std::size_t>(o)]));
      z[static_cast<std::size_t>(g * out + o)] = l.zero[static_cast<std::size_t>(o)];
      for (std::size_t m = 0; m < members.size(); ++m)
        q[static_cast<std::size_t>(o * in + members[m])] = l.q[static_cast<std::size_t>(o) * members.size() + m];
    }
  }
  PackedLayer p;
  const auto nibble = [](std::uint32_t v, int k) { return v << (4 * k); };
  const bool gptq = packing != Packing::awq;
  if (gptq) {
    p.qweight.assign(static_cast<std::size_t>(in / 8 * out), 0);
    for (std::int64_t i = 0; i < in; ++i)
      for (std::int64_t o = 0; o < out; ++o)
        p.qweight[static_cast<std::size_t>((i / 8) * out + o)] |=
            static_cast<std::int32_t>(nibble(q[static_cast<std::size_t>(o * in + i)], static_cast<int>(i % 8)));
  } else {
    p.qweight.assign(static_cast<std::size_t>(in * out / 8), 0);
    for (std::int64_t i = 0; i < in; ++i)
      for (std::int64_t c = 0; c < out / 8; ++c)
        for (int k = 0; k < 8; ++k)
          p.qweight[static_cast<std::size_t>(i * (out / 8) + c)] |= static_cast<std::int32_t>(
              nibble(q[static_cast<std::size_t>((c * 8 + Int4::kAwqOrder[static_cast<std::size_t>(k)]) * in + i)], k));
  }
  p.qzeros.assign(static_cast<std::size_t>(groups * out / 8), 0);
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t c = 0; c < out / 8; ++c)
      for (int k = 0; k < 8; ++k) {
        const std::int64_t o = c * 8 + (gptq ? k : Int4::kAwqOrder[static_cast<std::size_t>(k)]);
        const auto stored = static_cast<std::uint32_t>(z[static_cast<std::size_t>(g * out + o)]) - (gptq ? 1u : 0u);
        p.qzeros[static_cast<std::size_t>(g * (out / 8) + c)] |= static_cast<std::int32_t>(nibble(stored & 15u, k));
      }
  for (float v : s) p.scales.push_back(f32_to_f16(v));
  if (packing == Packing::gptq_act_order) p.g_idx = group_of;
  p.dequantized.resize(static_cast<std::size_t>(out * in));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) {
      const auto k = static_cast<std::size_t>(group_of[static_cast<std::size_t>(i)] * out + o);
      p.dequantized[static_cast<std::size_t>(o * in + i)] = s[k] * (static_cast<float>(q[static_cast<std::size_t>(o * in + i)]) - z[k]);
    }
  return p;
}

inline std::vector<SafetensorsEntry> packed_entries(const std::string& name, const std::vector<float>& w, std::int64_t out,
                                             std::int64_t in, Packing packing) {
  const PackedLayer p = pack(w, out, in, packing);
  const std::string m = name.substr(0, name.size() - std::string(".weight").size());
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  const std::int64_t groups = in / 32;
  std::vector<SafetensorsEntry> e{
      packing == Packing::awq ? SafetensorsEntry::of<std::int32_t>(m + ".qweight", "I32", {u(in), u(out / 8)}, p.qweight)
                              : SafetensorsEntry::of<std::int32_t>(m + ".qweight", "I32", {u(in / 8), u(out)}, p.qweight),
      SafetensorsEntry::of<std::int32_t>(m + ".qzeros", "I32", {u(groups), u(out / 8)}, p.qzeros),
      SafetensorsEntry::of<std::uint16_t>(m + ".scales", "F16", {u(groups), u(out)}, p.scales)};
  if (!p.g_idx.empty()) e.push_back(SafetensorsEntry::of<std::int32_t>(m + ".g_idx", "I32", {u(in)}, p.g_idx));
  return e;
}

inline std::vector<SafetensorsEntry> dequantized_entries(const std::string& name, const std::vector<float>& w, std::int64_t out,
                                                  std::int64_t in, Packing packing) {
  return {SafetensorsEntry::of<float>(name, "F32", {static_cast<std::uint64_t>(out), static_cast<std::uint64_t>(in)},
                                      pack(w, out, in, packing).dequantized)};
}

}  // namespace infer::test
