// Text-level behaviour on the default model: stop strings cut the output, EOS ends a chat turn, and the
// streamed deltas add up to the final text.
#include "engine_test_support.hpp"

using namespace infer;
using namespace infer::test;

TEST_CASE("stop strings, EOS and streamed deltas on SmolLM2", "[engine][text][model]") {
  PagedEngine<cpu, 16> engine(default_model(), EngineOptions{});
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 40;
  p.stop = {" 9"};
  const RequestId counting = engine.add_request(std::string_view("1, 2, 3, 4, 5,"), p);  // HF: " 6, 7, 8, 9, 10, ..."

  SamplingParams chat;
  chat.temperature = 0;
  chat.max_tokens = 200;
  const std::string turn =
      "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n";
  const RequestId answer = engine.add_request(std::string_view(turn), chat);

  std::map<RequestId, std::string> streamed;
  std::map<RequestId, RequestOutput> final;
  while (engine.has_unfinished())
    for (const auto& r : engine.step()) {
      streamed[r.id] += r.outputs[0].delta_text;
      if (r.finished) final[r.id] = r;
    }
  const auto& c = final.at(counting).outputs[0];
  CHECK(c.text == " 6, 7, 8,");
  CHECK(c.finish_reason == FinishReason::stop);
  const auto& a = final.at(answer).outputs[0];
  CHECK(a.finish_reason == FinishReason::stop);  // <|im_end|> before 200 tokens
  CHECK(a.text.find("Everest") != std::string::npos);
  CHECK(a.text.find("<|im_end|>") == std::string::npos);
  CHECK(streamed.at(counting) == c.text);
  CHECK(streamed.at(answer) == a.text);
  check_all_blocks_free(engine);
}
