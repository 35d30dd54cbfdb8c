// The FIFO queue and the metrics that count it.
#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <vector>

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

// The queued places each waiting task has been told, in order (and nothing else was pushed to it).
std::vector<int64_t> places_told(GenerationTask& task, int64_t prompt_tokens) {
  std::vector<int64_t> told;
  while (std::optional<EngineEvent> e = task.events.pop(std::chrono::milliseconds(0))) {
    EXPECT_EQ(e->kind, EngineEvent::Kind::progress);
    EXPECT_TRUE(e->progress.queued);
    EXPECT_EQ(e->progress.prompt.total, prompt_tokens);
    EXPECT_EQ(e->progress.prompt.processed, 0);
    told.push_back(e->progress.queued_ahead);
  }
  return told;
}

// Only tasks that asked are told their place, once each time it changes.
TEST(RequestQueue, ReportPositionsTellsTheTasksThatAskedWhenTheirPlaceChanged) {
  RequestQueue q(8);
  std::shared_ptr<GenerationTask> t[4];
  for (int i = 0; i < 4; ++i) {
    t[i] = std::make_shared<GenerationTask>();
    t[i]->request.prompt.assign(size_t(10 + i), 3);
    t[i]->report_progress = i != 1;  // t[1] did not ask
    ASSERT_TRUE(q.push(t[i]));
  }
  q.report_positions();
  EXPECT_EQ(places_told(*t[0], 10), std::vector<int64_t>{0});
  EXPECT_EQ(places_told(*t[2], 12), std::vector<int64_t>{2});
  EXPECT_EQ(places_told(*t[3], 13), std::vector<int64_t>{3});
  q.report_positions();  // nothing moved: nothing new
  EXPECT_TRUE(places_told(*t[2], 12).empty());
  EXPECT_EQ(q.pop(), t[0]);
  EXPECT_TRUE(q.remove(t[2]));
  q.report_positions();
  EXPECT_TRUE(places_told(*t[0], 10).empty()) << "a task that left the queue is not told";
  EXPECT_TRUE(places_told(*t[1], 11).empty()) << "nor one that did not ask";
  EXPECT_TRUE(places_told(*t[2], 12).empty());
  EXPECT_EQ(places_told(*t[3], 13), std::vector<int64_t>{1});
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
