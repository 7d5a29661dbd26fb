#pragma once
/// \file
/// What an engine file fixes about the engine that loads it. An engine is built for one engine kind,
/// block size, quantizer, static shape and max_model_len on one backend and architecture by one version
/// of infer; `engine_file_options` turns the file's header and the options a caller asked for into the
/// options it runs with, and refuses, naming both values, what cannot run:
///
/// - a file written by another version of infer, or for another backend or architecture (UnsupportedError);
/// - a setting asked for that differs from the file's (InvalidArgument). A setting left at its default
///   takes the file's; so `infer-generate --engine-file F` needs no other flag, and `--quantizer fp8` with a
///   file built for int8 is refused rather than silently ignored.
///
/// The run-time settings (KV cache size, scheduler limits, prefix caching, GPU memory fraction, graphs)
/// stay the caller's: they do not change the weights' layout.

#include <string>
#include <string_view>

#include "infer/core/error.hpp"
#include "infer/engine/llm_options.hpp"
#include "infer/io/engine_file.hpp"
#include "infer/version.hpp"

namespace infer {

/// `asked` with the file's fixed settings filled in; `backend` ("cpu", "cuda" or "auto") becomes the file's.
/// Errors as the file comment says.
inline LlmOptions engine_file_options(const EngineFileInfo& info, const std::filesystem::path& path, LlmOptions asked,
                                      std::string& backend) {
  using detail::cat;
  const std::string where = cat("engine file '", path.string(), "'");
  if (info.library_version != INFER_VERSION)
    throw UnsupportedError(cat(where, " was built by infer ", info.library_version, "; this is infer ", INFER_VERSION,
                               ": rebuild it (infer-build, or --rebuild)"));
  if (backend != "auto" && backend != info.backend)
    throw UnsupportedError(cat(where, " was built for backend ", info.backend, "; this run asks for backend ", backend,
                               ": use --backend ", info.backend, " or rebuild it"));
  if (info.architecture != engine_file_architecture(info.backend))
    throw UnsupportedError(cat(where, " was built for architecture ", info.architecture, "; this machine's ",
                               info.backend, " backend is ", engine_file_architecture(info.backend), ": rebuild it here"));
  backend = info.backend;
  const LlmOptions defaults;
  auto fixed = [&](const char* what, const auto& mine, const auto& def, const auto& theirs) {
    if (mine != def && mine != theirs)
      throw InvalidArgument(cat(where, " was built with ", what, " ", theirs, "; this run asks for ", what, " ", mine,
                                ": drop the setting, or rebuild the file (--rebuild)"));
  };
  fixed("engine", asked.engine, defaults.engine, info.engine);
  fixed("quantizer", asked.quantizer, defaults.quantizer, info.quantizer);
  if (info.engine == "paged") fixed("block_size", asked.block_size, defaults.block_size, info.block_size);
  fixed("max_model_len", asked.engine_options.max_model_len, defaults.engine_options.max_model_len,
        info.engine_options.max_model_len);
  if (info.engine == "static") {
    const Shape& s = asked.engine_options.static_shape;
    const Shape& d = defaults.engine_options.static_shape;
    const Shape& f = info.engine_options.static_shape;
    fixed("max_batch", s.max_batch, d.max_batch, f.max_batch);
    fixed("max_input", s.max_input, d.max_input, f.max_input);
    fixed("max_output", s.max_output, d.max_output, f.max_output);
  }
  asked.engine = info.engine;
  asked.quantizer = info.quantizer;
  asked.block_size = info.block_size;
  asked.engine_options.max_model_len = info.engine_options.max_model_len;
  asked.engine_options.static_shape = info.engine_options.static_shape;
  return asked;
}

}  // namespace infer
