#pragma once
/// \file
/// The server's names for the engine registry (engine/engine_registry.hpp): its engine thread, router and
/// tests hold engines as `EngineHandle`s built by `make_engine` from a `ModelSpec` and `LlmOptions`.

#include "infer/engine/engine_registry.hpp"

namespace infer::serve {

using infer::EngineAdapter;
using infer::EngineHandle;
using infer::EngineInfo;
using infer::make_engine;
using infer::ModelSpec;

}  // namespace infer::serve
