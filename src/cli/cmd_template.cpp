// tern template -m DIR: a chat-completions request body on stdin -> the rendered prompt on stdout (no newline added).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/check.h"
#include "text/chat_template.h"

namespace tern::cli {

void command_template(CLI::App& app) {
  struct Options {
    std::string model_dir;
    std::string template_file;
  };
  auto opt = std::make_shared<Options>();
  auto* sub = app.add_subcommand("template", "Render a chat request (JSON on stdin) through the model's chat template");
  sub->add_option("-m,--model", opt->model_dir, "Model folder (chat_template.jinja or tokenizer_config.json)");
  sub->add_option("--template", opt->template_file, "A chat template file to use instead of the model folder's");
  sub->callback([opt] {
    TERN_CHECK(!opt->model_dir.empty() || !opt->template_file.empty(), "tern template: give -m DIR or --template FILE");
    std::string body((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    nlohmann::ordered_json req = nlohmann::ordered_json::parse(body, nullptr, false);
    TERN_CHECK(!req.is_discarded() && req.is_object(), "tern template: stdin is not a JSON object");
    TERN_CHECK(req.contains("messages") && req["messages"].is_array(), "tern template: the body has no messages array");
    ChatTemplate tmpl = [&] {
      if (opt->template_file.empty()) return ChatTemplate::from_model_dir(opt->model_dir);
      std::FILE* f = std::fopen(opt->template_file.c_str(), "rb");
      TERN_CHECK(f != nullptr, "tern template: cannot read ", opt->template_file);
      std::string src;
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) src.append(buf, n);
      std::fclose(f);
      return ChatTemplate::from_source(std::move(src));
    }();
    ChatTemplateInputs in;
    in.messages = req["messages"];
    in.tools = req.contains("tools") ? req["tools"] : nlohmann::ordered_json();
    if (req.contains("add_generation_prompt")) {
      TERN_CHECK(req["add_generation_prompt"].is_boolean(), "tern template: add_generation_prompt must be a boolean");
      in.add_generation_prompt = req["add_generation_prompt"].get<bool>();
    }
    if (req.contains("chat_template_kwargs")) in.extra_kwargs = req["chat_template_kwargs"];
    std::string prompt = tmpl.render(in);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  });
}

}  // namespace tern::cli
