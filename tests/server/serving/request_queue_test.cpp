// The FIFO queue and the metrics that count it.
#include <gtest/gtest.h>

#include <thread>

#include "server/serving/metrics.h"
#include "server/serving/request_queue.h"

namespace tern::server {
namespace {

TEST(RequestQueue, FifoWithDepthLimit) {
  RequestQueue q(2);
  auto a = std::make_shared<GenerationTask>(), b = std::make_shared<GenerationTask>(),
       c = std::make_shared<GenerationTask>();
  EXPECT_TRUE(q.push(a));
  EXPECT_TRUE(q.push(b));
  EXPECT_FALSE(q.push(c));  // full
  EXPECT_EQ(q.waiting(), 2u);
  EXPECT_EQ(q.pop(), a);
  EXPECT_TRUE(q.push(c));
  EXPECT_TRUE(q.remove(b));
  EXPECT_FALSE(q.remove(b));
  EXPECT_EQ(q.pop(), c);
  q.close();
  EXPECT_EQ(q.pop(), nullptr);
  EXPECT_FALSE(q.push(a));
}

TEST(RequestQueue, PopWaitsForPush) {
  RequestQueue q(4);
  auto a = std::make_shared<GenerationTask>();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    q.push(a);
  });
  EXPECT_EQ(q.pop(), a);
  t.join();
}

TEST(EventChannel, TimesOutThenDelivers) {
  EventChannel ch;
  EXPECT_FALSE(ch.pop(std::chrono::milliseconds(1)).has_value());
  TokenEvent t;
  t.id = 7;
  ch.push(EngineEvent::of_token(t));
  ch.push(EngineEvent::of_error(api_error_invalid("x", "y")));
  auto e = ch.pop(std::chrono::milliseconds(1));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->token.id, 7);
  EXPECT_EQ(ch.pop(std::chrono::milliseconds(1))->kind, EngineEvent::Kind::error);
}

TEST(Metrics, QueueCountsAddUp) {
  Metrics m;
  for (int i = 0; i < 5; ++i) m.on_queue_accepted();
  m.on_queue_rejected();
  m.on_queue_dropped();
  m.on_task_started(0.5);
  m.on_task_started(0.1);
  m.on_task_finished(TaskOutcome::completed, 10, 0, 4, 0.1, 0.3);
  EXPECT_EQ(m.waiting(), 2);
  EXPECT_EQ(m.running(), 1);
  const std::string text = m.render_prometheus();
  EXPECT_NE(text.find("tern_queue_accepted_total 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tern_queue_rejected_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("tern_queue_finished_total{outcome=\"cancelled\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("tern_queue_finished_total{outcome=\"completed\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("tern_prompt_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("tern_decode_tokens_per_second 10\n"), std::string::npos);  // 3 tokens in 0.3 s
  EXPECT_NE(text.find("# TYPE tern_queue_waiting gauge"), std::string::npos);
}

}  // namespace
}  // namespace tern::server
