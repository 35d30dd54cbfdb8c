// How the API parsers read images (each API's <api>_schema.cpp): an image URL (a data: URL with base64 bytes, or an
// http(s) URL kept for the server to fetch or refuse) or a base64 field into a RequestImage, and a message's content
// built from text and image parts in the form the chat template takes. Nothing here knows the model; serving/
// prompt_images.h decodes the images once the prompt is rendered. Failed checks throw request_fields::BadRequest
// (a 400 naming the field).
#pragma once

#include <string>
#include <vector>

#include "server/serving/chat_request.h"

namespace tern::server {

// `url` of the field `param`: "data:[<media type>][;base64],<data>" (base64 required; the media type, when given, an
// image/* one) gives the bytes; "http://..." or "https://..." is kept as a URL. Anything else is a 400.
RequestImage request_image_from_url(const std::string& url, const std::string& param);
// The base64 text of the field `param` (Anthropic's source.data, Ollama's images[i]); a data: URL is accepted too.
RequestImage request_image_from_base64(const std::string& text, const std::string& param);

// A message's content as the chat template reads it: the plain string when it holds text only (as every text-only
// request renders today), else an array of {"type": "text", "text"} and {"type": "image"} parts in order (adjacent
// texts joined).
class MessageContent {
 public:
  void add_text(const std::string& text);
  void add_image();
  bool has_images() const { return images_ > 0; }
  const std::string& text() const { return text_; }  // the text parts joined
  Json json() const;

 private:
  Json parts_ = Json::array();
  std::string text_;
  std::string pending_;  // text since the last image
  int images_ = 0;
};

}  // namespace tern::server
