// infer-tokenize --model MODEL (--text T | --file F) [--chat] [--json]
// infer-tokenize --model MODEL --decode IDS [--json]
//
// Prints the token ids of a text with the model's own tokenizer (from a .gguf file, a tokenizer.json, or a
// Hugging Face folder holding one). --chat wraps the text as one user turn in the model's chat template
// (with the generation prompt) first; --chat-template NAME picks a built-in template when the model's own is
// not recognised. --decode turns ids ("1 2 3", "1,2,3" or "[1,2,3]") back into text.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "infer/io/gguf.hpp"
#include "infer/tokenizer/chat_template.hpp"
#include "infer/tokenizer/gguf_vocab.hpp"
#include "infer/tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Options {
  std::string model, text, file, decode, chat_template;
  bool text_given = false, chat = false, json = false, no_special = false;
  std::optional<bool> add_bos;
};

bool starts_with_gguf_magic(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

infer::Tokenizer load_tokenizer(const fs::path& model) {
  if (fs::is_directory(model)) return infer::Tokenizer::from_hf_json(model / "tokenizer.json");
  if (starts_with_gguf_magic(model)) return infer::Tokenizer::from_gguf(infer::gguf::File::open(model));
  return infer::Tokenizer::from_hf_json(model);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw infer::IoError(infer::detail::cat("cannot read --file '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// "1 2 3", "1,2,3" and "[1, 2, 3]" all give {1, 2, 3}; anything else names the bad item.
std::vector<std::int32_t> parse_ids(std::string s) {
  for (char& c : s)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream in(s);
  std::vector<std::int32_t> ids;
  std::string item;
  while (in >> item) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < INT32_MIN || v > INT32_MAX)
      throw infer::InvalidArgument(infer::detail::cat("--decode: '", item, "' is not a token id"));
    ids.push_back(static_cast<std::int32_t>(v));
  }
  return ids;
}

int run(const Options& o) {
  const auto tok = load_tokenizer(o.model);
  if (!o.decode.empty()) {
    const auto ids = parse_ids(o.decode);
    const std::string text = tok.decode(ids);
    if (o.json) fmt::print("{}\n", json{{"ids", ids}, {"text", text}}.dump(1));
    else fmt::print("{}\n", text);
    return 0;
  }
  std::string text = o.text_given ? o.text : read_file(o.file);
  std::string prompt = text;
  if (o.chat) {
    const auto tmpl = o.chat_template.empty() ? infer::ChatTemplate::from_source(tok.chat_template_source())
                                              : infer::ChatTemplate::from_name(o.chat_template);
    prompt = tmpl.apply(std::vector<infer::ChatMessage>{{"user", text}}, /*add_generation_prompt=*/true);
  }
  infer::EncodeOptions opts;
  opts.parse_special = !o.no_special;
  // A rendered chat already starts with whatever BOS text the template writes.
  opts.add_bos = o.chat ? std::optional<bool>(false) : o.add_bos;
  const auto ids = tok.encode(prompt, opts);
  if (o.json) {
    json pieces = json::array();
    for (auto id : ids) pieces.push_back(tok.token(id));
    json doc{{"text", text}, {"ids", ids}, {"tokens", pieces}, {"count", ids.size()}};
    if (o.chat) doc["prompt"] = prompt;
    fmt::print("{}\n", doc.dump(1));
  } else {
    fmt::print("{}\n", fmt::join(ids, " "));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Print the token ids of a text, or the text of token ids, with a model's tokenizer", "infer-tokenize"};
  Options o;
  app.add_option("--model,-m", o.model, "a .gguf file, a tokenizer.json, or a folder holding tokenizer.json")
      ->required();
  auto* text = app.add_option("--text,-t", o.text, "the text to tokenize");
  auto* file = app.add_option("--file,-f", o.file, "a file whose whole content is tokenized");
  auto* decode = app.add_option("--decode,-d", o.decode, "token ids to turn back into text");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  app.add_flag("--chat", o.chat, "tokenize the text as a user turn of the model's chat template");
  app.add_option("--chat-template", o.chat_template, "a built-in template instead of the model's: chatml, llama3, llama3.1, mistral");
  app.add_flag("--no-special", o.no_special, "tokenize special-token text (e.g. <|im_start|>) as plain text");
  app.add_flag("--add-bos,!--no-bos", o.add_bos, "add (or not) the BOS token; default: the model's setting");
  app.add_flag("--json", o.json, "print one JSON document");
  CLI11_PARSE(app, argc, argv);
  o.text_given = text->count() > 0;
  if (!o.text_given && file->count() == 0 && decode->count() == 0) {
    fmt::print(stderr, "infer-tokenize: one of --text, --file or --decode is required\n{}", app.help());
    return 2;
  }
  try {
    return run(o);
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-tokenize: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-tokenize: error: {}\n", e.what());
    return 1;
  }
}
