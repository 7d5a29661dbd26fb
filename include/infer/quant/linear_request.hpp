#pragma once
/// \file
/// `LinearRequest`: a linear layer's weight asked for by role, as a Quantizer that loads by role sees it
/// (`Q::load<B>(const LinearRequest&, store)`, the RoleQuantizer concept). It carries the model source, the
/// canonical role ("blk.3.attn_q", "output", ...) and the logical shape [out, in] the config implies, so
/// the Quantizer can read companion tensors (scales, zeros, g_idx: ModelSource's `<role>.<companion>`)
/// and check its own shapes: a packed INT4 `qweight` is not [out, in], and only its Quantizer knows what
/// it should be. A Quantizer that loads one tensor (`Q::load<B>(const WeightTensor&, store)`) gets the
/// weight with its shape checked by `load_linear`, as before; the decoders call `load_linear` for either.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/weight_tensor.hpp"

namespace infer {

struct LinearRequest {
  const ModelSource& source;
  std::string role;         ///< canonical role of the weight
  std::int64_t out = 0;     ///< logical output features (rows of the [out, in] matrix)
  std::int64_t in = 0;      ///< logical input features
  /// The LM head, tied to the embedding or not (its role is then "token_embd"). A low-precision Quantizer
  /// may keep it in a wider format, as GPTQ and AWQ checkpoints leave `lm_head` unquantized.
  bool lm_head = false;

  /// The role's main tensor (`<module>.weight`); NotFoundError naming it when absent.
  [[nodiscard]] WeightTensor weight() const { return source.get(role); }

  /// `<role>.<companion>` (e.g. "weight_scale"), or nullopt when the file has none.
  [[nodiscard]] std::optional<WeightTensor> companion(std::string_view name) const {
    return source.find(detail::cat(role, ".", name));
  }
  /// As companion(), but NotFoundError naming what the Quantizer needs it for.
  [[nodiscard]] WeightTensor require_companion(std::string_view name, std::string_view quantizer) const {
    if (auto t = companion(name)) return std::move(*t);
    throw NotFoundError(detail::cat(quantizer, ": weight '", role, "' needs its '", name, "' tensor ('",
                                    source.file_name(detail::cat(role, ".", name)), "'), which is not in ",
                                    source.describe()));
  }

  /// The weight, checked to be [out, in]: what a one-tensor Quantizer is given.
  [[nodiscard]] WeightTensor checked_weight() const {
    WeightTensor t = weight();
    if (t.shape.size() != 2 || t.shape[0] != static_cast<std::uint64_t>(out) ||
        t.shape[1] != static_cast<std::uint64_t>(in))
      wrong_shape(t, detail::cat("[", out, ", ", in, "]"));
    return t;
  }

  /// FormatError naming the model, the tensor, its role and both shapes.
  [[noreturn]] void wrong_shape(const WeightTensor& t, const std::string& expected) const {
    std::string got = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) got += (i ? ", " : "") + std::to_string(t.shape[i]);
    throw FormatError(detail::cat(source.describe(), ": tensor '", t.name, "' (", role, ") has shape ", got,
                                  "], expected ", expected, " from the model config"));
  }
};

/// The Quantizer (as LlmOptions names it) that reads checkpoints quantized as `qc` says, for Q of `name`;
/// empty for Quantizers that read unquantized weights only.
constexpr std::string_view checkpoint_quantizer_of(std::string_view quantizer_name) {
  if (quantizer_name == "int8-weight-only") return "int8";
  if (quantizer_name == "fp8") return "fp8";
  if (quantizer_name == "int4") return "int4";
  return "";
}

/// Loads `r` through `Q`: by role when Q can, else its [out, in]-checked weight; then checks that the
/// result is [out, in] (FormatError naming the Quantizer otherwise). When the checkpoint is quantized
/// (ModelConfig::quantization) in a layout Q does not read and its tensor cannot be loaded, the error says
/// which quantizer does (UnsupportedError), instead of only that `weight` is missing.
template <class Q, class B>
  requires Quantizer<Q, B>
typename Q::template linear<B> load_linear(const LinearRequest& r, typename BackendTraits<B>::weight_store& store) {
  auto load = [&] {
    if constexpr (RoleQuantizer<Q, B>) return Q::template load<B>(r, store);
    else return Q::template load<B>(r.checked_weight(), store);
  };
  const auto& qc = r.source.config().quantization;
  auto w = [&] {
    if (!qc || qc->quantizer == checkpoint_quantizer_of(Q::name)) return load();
    try {
      return load();
    } catch (const Error& e) {  // e.g. GPTQ's qweight where an unquantized `weight` was looked for
      throw UnsupportedError(detail::cat(r.source.describe(), " is quantized (quantization_config: ", qc->method, ", ",
                                         qc->bits, "-bit), which quantizer ", Q::name, " does not read",
                                         qc->quantizer.empty() ? std::string() : detail::cat(": use --quantizer ", qc->quantizer),
                                         " (loading '", r.role, "': ", e.what(), ")"));
    }
  }();
  require<FormatError>(static_cast<std::int64_t>(w.out()) == r.out && static_cast<std::int64_t>(w.in()) == r.in,
                       Q::name, "::load of '", r.role, "' gave [", w.out(), ", ", w.in(), "], expected [", r.out, ", ",
                       r.in, "]");
  return w;
}

}  // namespace infer
