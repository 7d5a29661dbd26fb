#pragma once
/// \file
/// The umbrella header: everything a user of infer normally needs. Include narrower headers to keep
/// compile times down in large projects.

#include "infer/version.hpp"

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/core/type_name.hpp"

#include "infer/dist/communicator.hpp"
#include "infer/dist/data_parallel.hpp"

#include "infer/engine/engine.hpp"
#include "infer/engine/llm.hpp"
#include "infer/engine/presets.hpp"
#include "infer/engine/step_trace.hpp"

#include "infer/io/gguf.hpp"
#include "infer/io/mapped_file.hpp"
#include "infer/io/safetensors.hpp"

#include "infer/memory/contiguous_allocator.hpp"
#include "infer/memory/paged_allocator.hpp"

#include "infer/model/gguf_config.hpp"
#include "infer/model/hf_config.hpp"
#include "infer/model/llama.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"

#include "infer/quant/dequantize.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/fp8.hpp"
#include "infer/quant/gguf_blocks.hpp"
#include "infer/quant/int4.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "infer/quant/linear_request.hpp"

#include "infer/sampling/sampler.hpp"
#include "infer/sampling/sampling_params.hpp"
#include "infer/sampling/stop_checker.hpp"

#include "infer/sched/continuous_batch.hpp"
#include "infer/sched/invariants.hpp"
#include "infer/sched/static_batch.hpp"

#include "infer/tokenizer/chat_template.hpp"
#include "infer/tokenizer/gguf_vocab.hpp"
#include "infer/tokenizer/incremental_decoder.hpp"
#include "infer/tokenizer/tokenizer.hpp"
