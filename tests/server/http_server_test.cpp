// The server before its model is loaded (set_model not called yet): /health says loading, generation routes are 503,
// and /v1/models already lists the names announced in the options, so that a client reading the list once at start
// finds the model; the admission checks (Host, CORS) already hold. Then set_model with the memory plan's choices.
#include <gtest/gtest.h>

#include <thread>

#include <httplib.h>

#include "cpu/cpu_runner.h"
#include "engine/demo_model.h"
#include "engine/generator.h"
#include "engine/model_source.h"
#include "server/http/json.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tern::server {
namespace {

// A server listening on a free loopback port, without a model; stopped at the end of the test.
class LoadingServer {
 public:
  explicit LoadingServer(ServerOptions options) : server_(with_test_defaults(std::move(options))) {
    port_ = server_.bind();
    listener_ = std::thread([this] { server_.listen(); });
  }
  ~LoadingServer() {
    server_.stop();
    listener_.join();
  }
  httplib::Result get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client client("127.0.0.1", port_);
    return client.Get(path, headers);
  }
  httplib::Result options(const std::string& path, const httplib::Headers& headers) {
    httplib::Client client("127.0.0.1", port_);
    return client.Options(path, headers);
  }
  HttpServer& http() { return server_; }

 private:
  static ServerOptions with_test_defaults(ServerOptions o) {
    o.host = "127.0.0.1";
    o.port = 0;
    o.log_requests = false;
    return o;
  }
  HttpServer server_;
  int port_ = 0;
  std::thread listener_;
};

TEST(HttpServer, ModelsListsTheAnnouncedNamesWhileLoading) {
  ServerOptions o;
  o.model_id = "org/model";
  o.model_aliases = {"gpt-4o"};
  LoadingServer server(o);
  auto health = server.get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);  // still loading

  auto list = server.get("/v1/models");
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  const Json body = Json::parse(list->body);
  ASSERT_EQ(body["data"].size(), 2u) << list->body;
  EXPECT_EQ(body["data"][0]["id"], "org/model");
  EXPECT_EQ(body["data"][1]["id"], "gpt-4o");
  EXPECT_EQ(body["data"][1]["root"], "org/model");
  EXPECT_FALSE(body["data"][0].contains("max_model_len")) << "the context is not known before the model loads";

  auto one = server.get("/v1/models/gpt-4o");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(Json::parse(one->body)["id"], "gpt-4o");
  auto tagged = server.get("/v1/models/gpt-4o:latest");
  ASSERT_TRUE(tagged);
  EXPECT_EQ(tagged->status, 200);
  EXPECT_EQ(Json::parse(tagged->body)["id"], "gpt-4o");
  // Any other name is the served model (as on the generation routes), under its id.
  auto other = server.get("/v1/models/other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);
  EXPECT_EQ(Json::parse(other->body)["id"], "org/model");
}

TEST(HttpServer, StrictModelNameRefusesOtherNames) {
  ServerOptions o;
  o.model_id = "org/model";
  o.model_aliases = {"gpt-4o"};
  o.strict_model_name = true;
  LoadingServer server(o);
  auto other = server.get("/v1/models/other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_NE(other->body.find("serves 'org/model'"), std::string::npos) << other->body;
  auto tagged = server.get("/v1/models/org/model:latest");
  ASSERT_TRUE(tagged);
  EXPECT_EQ(tagged->status, 200);
  EXPECT_EQ(Json::parse(tagged->body)["id"], "org/model");
}

// A page on this machine (a loopback Origin) gets CORS answers without --cors-origin, preflights included; its
// Origin does not open the Host check (DNS rebinding).
TEST(HttpServer, LoopbackOriginsGetCorsAndTheHostCheckStays) {
  LoadingServer server(ServerOptions{});
  const httplib::Headers page = {{"Origin", "http://localhost:3000"}};
  auto list = server.get("/v1/models", page);
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_EQ(list->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  auto preflight = server.options("/v1/chat/completions", {{"Origin", "http://127.0.0.1:5173"},
                                                           {"Access-Control-Request-Method", "POST"},
                                                           {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://127.0.0.1:5173");
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  auto other = server.get("/v1/models", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  for (const char* host : {"evil.example", "localhost.evil.example:3000"}) {
    auto rebound = server.get("/v1/models", {{"Host", host}, {"Origin", "http://localhost:3000"}});
    ASSERT_TRUE(rebound);
    EXPECT_EQ(rebound->status, 403) << host;
    auto rebound_preflight = server.options("/v1/chat/completions", {{"Host", host}, {"Origin", "http://localhost:3000"}});
    ASSERT_TRUE(rebound_preflight);
    EXPECT_EQ(rebound_preflight->status, 403) << host;
  }
}

// tern serve's memory plan (cli/memory_flags.h) hands its choices over with the model: they replace the flags'.
TEST(HttpServer, TheMemoryPlansChoicesReplaceTheFlags) {
  const auto runner = cpu_runner_create(demo_model_build());
  const auto tokenizer = demo_tokenizer();
  const ChatTemplate tmpl = ChatTemplate::from_source(demo_chat_template_source());
  Generator generator(*runner, *tokenizer);
  ServerOptions o;
  o.scheduler.parallel = 4;   // as the flags said
  o.prefix_cache.slots = 4;
  LoadingServer server(o);
  ServerModel m;
  m.model_id = "demo";
  m.tokenizer = tokenizer.get();
  m.chat_template = &tmpl;
  m.generator = &generator;
  m.context = 512;
  m.vocab_size = runner->vocab_real();
  m.parallel = 2;  // as the plan chose
  m.cache_slots = 3;
  m.cache_gpu_bytes = 0;
  server.http().set_model(m);
  EXPECT_EQ(server.http().parallel(), 2);
  auto props = server.get("/props");
  ASSERT_TRUE(props);
  ASSERT_EQ(props->status, 200) << props->body;
  EXPECT_EQ(Json::parse(props->body)["prefix_cache_slots"], 3) << props->body;
  EXPECT_EQ(Json::parse(props->body)["n_ctx"], 512) << props->body;
}

TEST(HttpServer, ModelsIsEmptyWhileLoadingWithoutAnnouncedNames) {
  LoadingServer server(ServerOptions{});
  auto list = server.get("/v1/models");
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_TRUE(Json::parse(list->body)["data"].empty()) << list->body;
}

}  // namespace
}  // namespace tern::server
