#include <gtest/gtest.h>

#include <numeric>

#include "tokenspeed/scheduler.h"

using namespace tokenspeed;

namespace {

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.page_size = 4;
  c.num_device_pages = 16;
  c.max_scheduled_tokens = 64;
  c.max_batch_size = 4;
  return c;
}

std::vector<int32_t> iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Reports one token for every sampled request of the plan.
void report(Scheduler& s, const ExecutionPlan& plan, int32_t token = 7) {
  if (!plan.forward) return;
  const auto n = std::count(plan.forward->sample_mask.begin(), plan.forward->sample_mask.end(), 1);
  s.advance(ForwardResult{plan.forward->forward_id, std::vector<int32_t>(n, token), {}});
  s.check_invariants();
}

}  // namespace

TEST(Scheduler, RejectsImpossibleRequestsAtSubmit) {
  Scheduler s(small_config());  // 16 pages of 4 tokens, max_model_len 64
  EXPECT_THROW(s.submit_requests({{"a", {}, 4, 0}}), std::invalid_argument);
  EXPECT_THROW(s.submit_requests({{"a", iota(60), 8, 0}}), std::invalid_argument);
  EXPECT_THROW(s.submit_requests({{"a", iota(4), 0, 0}}), std::invalid_argument);
  EXPECT_THROW(s.submit_requests({{"a", {-1}, 1, 0}}), std::invalid_argument);
  EXPECT_THROW(s.submit_requests({{"a", iota(4), 1, 0}, {"a", iota(4), 1, 0}}),
               std::invalid_argument);
  EXPECT_FALSE(s.has_unfinished());  // all or nothing
  s.submit_requests({{"a", iota(4), 1, 0}});
  EXPECT_THROW(s.submit_requests({{"a", iota(4), 1, 0}}), std::invalid_argument);
}

TEST(Scheduler, InvalidConfigFailsWithTheFieldName) {
  SchedulerConfig c = small_config();
  c.page_size = 0;
  try {
    Scheduler s(c);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("page_size"), std::string::npos);
  }
  c = small_config();
  c.num_host_pages = 4;
  c.enable_prefix_cache = false;
  EXPECT_THROW(Scheduler{c}, std::invalid_argument);
}

TEST(Scheduler, PrefillThenDecodeThenFinishAtMaxNewTokens) {
  Scheduler s(small_config());
  s.submit_requests({{"a", iota(6), 3, 0}});
  ExecutionPlan p = s.next_execution_plan();
  ASSERT_TRUE(p.forward);
  EXPECT_EQ(p.forward->mode, ForwardMode::kExtend);
  EXPECT_EQ(p.forward->extend_lens, std::vector<int32_t>{6});
  EXPECT_EQ(p.forward->input_ids, iota(6));
  EXPECT_EQ(p.forward->sample_mask, std::vector<uint8_t>{1});
  EXPECT_EQ(p.forward->block_table_cols, 2);
  report(s, p, 100);
  p = s.next_execution_plan();
  EXPECT_EQ(p.forward->mode, ForwardMode::kDecode);
  EXPECT_EQ(p.forward->prefix_lens, std::vector<int32_t>{6});
  EXPECT_EQ(p.forward->seq_lens, std::vector<int32_t>{7});
  EXPECT_EQ(p.forward->input_ids, std::vector<int32_t>{100});
  EXPECT_TRUE(p.forward->block_table_is_view);
  report(s, p);
  report(s, s.next_execution_plan());
  EXPECT_FALSE(s.has_unfinished());  // three tokens: finished by the scheduler
  EXPECT_EQ(s.request_stats("a").finish_reason, "length");
  EXPECT_FALSE(s.next_execution_plan().forward);
  EXPECT_THROW(s.request_stats("a"), UnknownRequest);  // forgotten after the next plan
}

TEST(Scheduler, ChunkedPrefillRespectsTheBudgetAndAlternatesWithDecode) {
  SchedulerConfig c = small_config();
  c.max_scheduled_tokens = 8;
  Scheduler s(c);
  s.submit_requests({{"short", iota(3), 20, 0}});
  report(s, s.next_execution_plan());
  s.submit_requests({{"long", iota(30, 50), 1, 0}});
  std::vector<ForwardMode> modes;
  for (int i = 0; i < 8; ++i) {
    const ExecutionPlan p = s.next_execution_plan();
    ASSERT_TRUE(p.forward);
    modes.push_back(p.forward->mode);
    if (p.forward->mode == ForwardMode::kExtend) {
      EXPECT_LE(p.forward->extend_lens[0], 8);
    }
    report(s, p);
  }
  // The decode request runs at least every other step while the long prompt is chunked.
  for (size_t i = 1; i < modes.size(); ++i) {
    EXPECT_FALSE(modes[i] == ForwardMode::kExtend && modes[i - 1] == ForwardMode::kExtend);
  }
}

TEST(Scheduler, MixedBatchPutsDecodesFirst) {
  SchedulerConfig c = small_config();
  c.enable_mixed_batch = true;
  Scheduler s(c);
  s.submit_requests({{"a", iota(3), 5, 0}});
  report(s, s.next_execution_plan());
  s.submit_requests({{"b", iota(5, 10), 5, 0}});
  const ExecutionPlan p = s.next_execution_plan();
  ASSERT_TRUE(p.forward);
  EXPECT_EQ(p.forward->mode, ForwardMode::kMixed);
  EXPECT_EQ(p.forward->num_decode, 1);
  EXPECT_EQ(std::string(p.forward->request_id(0)), "a");
  EXPECT_EQ(std::string(p.forward->request_id(1)), "b");
  EXPECT_EQ(p.forward->extend_lens, (std::vector<int32_t>{1, 5}));
  EXPECT_TRUE(p.forward->block_table_is_view);
}

TEST(Scheduler, MaxBatchSizeBoundsTheRunningSet) {
  SchedulerConfig c = small_config();
  c.max_batch_size = 2;
  Scheduler s(c);
  s.submit_requests({{"a", iota(2), 2, 0}, {"b", iota(2), 2, 0}, {"c", iota(2), 2, 0}});
  const ExecutionPlan p = s.next_execution_plan();
  EXPECT_EQ(p.forward->batch_size(), 2);
  EXPECT_EQ(s.stats().num_waiting, 1);
}

TEST(Scheduler, SharedPrefixIsComputedOnce) {
  Scheduler s(small_config());
  s.submit_requests({{"a", iota(10), 2, 0}});
  report(s, s.next_execution_plan());
  s.submit_requests({{"b", iota(9), 2, 0}});
  const ExecutionPlan p = s.next_execution_plan();  // a decodes (alternation)
  report(s, p);
  const ExecutionPlan q = s.next_execution_plan();
  ASSERT_EQ(q.forward->mode, ForwardMode::kExtend);
  EXPECT_EQ(q.forward->prefix_lens, std::vector<int32_t>{8});  // two full pages reused
  EXPECT_EQ(q.forward->extend_lens, std::vector<int32_t>{1});
  EXPECT_EQ(s.request_stats("b").cached_tokens, 8);
  EXPECT_EQ(s.stats().prefix_cache_hit_tokens, 8);
  EXPECT_EQ(s.stats().prefix_cache_queried_tokens, 19);
}

TEST(Scheduler, DecodePressureRetractsTheYoungestAndEveryoneFinishes) {
  SchedulerConfig c = small_config();
  c.num_device_pages = 6;
  c.page_size = 2;
  Scheduler s(c);
  s.submit_requests({{"old", iota(3), 6, 0}, {"young", iota(3, 20), 6, 0}});
  int steps = 0;
  while (s.has_unfinished() && steps < 200) {
    report(s, s.next_execution_plan());
    ++steps;
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_GT(s.stats().num_preemptions, 0);
}

TEST(Scheduler, HostTierWritesBackOnRetractionAndLoadsBackOnResume) {
  SchedulerConfig c = small_config();
  c.num_device_pages = 6;
  c.num_host_pages = 16;
  c.page_size = 2;
  Scheduler s(c);
  s.submit_requests({{"old", iota(5), 6, 0}, {"young", iota(5, 20), 6, 0}});
  bool wrote = false, loaded = false;
  int steps = 0;
  while (s.has_unfinished() && steps < 200) {
    const ExecutionPlan p = s.next_execution_plan();
    for (const CacheOp& op : p.cache_ops) {
      if (const auto* wb = std::get_if<WriteBackOp>(&op)) {
        wrote = true;
        s.advance(WriteBackDone{wb->op_id});
      } else {
        loaded = true;
        s.advance(LoadBackDone{std::get<LoadBackOp>(op).op_id});
      }
    }
    report(s, p);
    ++steps;
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_TRUE(wrote);
  EXPECT_TRUE(loaded);
}

TEST(Scheduler, AbortFreesEverythingInAnyState) {
  Scheduler s(small_config());
  s.submit_requests({{"w", iota(5), 4, 0}});
  s.advance(AbortRequest{"w"});  // waiting
  s.submit_requests({{"p", iota(5), 4, 0}});
  const ExecutionPlan p = s.next_execution_plan();
  s.advance(AbortRequest{"p"});  // prefill in flight
  s.advance(AbortRequest{"p"});  // twice is harmless
  s.advance(AbortRequest{"never-submitted"});
  s.check_invariants();
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.device_pages_active, 0);
  EXPECT_EQ(st.device_pages_free, 16);  // an abort publishes nothing to the cache
  EXPECT_FALSE(s.has_unfinished());
}

TEST(Scheduler, EventsForUnknownOrFinishedRequests) {
  Scheduler s(small_config());
  EXPECT_THROW(s.advance(ExtendResult{"ghost", {1}}), UnknownRequest);
  EXPECT_THROW(s.advance(FinishRequest{"ghost", "stop"}), UnknownRequest);
  s.submit_requests({{"a", iota(3), 1, 0}});
  EXPECT_THROW(s.advance(ExtendResult{"a", {1}}), fsm::InvalidTransition);  // never scheduled
  report(s, s.next_execution_plan());       // one token: finished by the scheduler
  s.advance(FinishRequest{"a", "length"});  // the engine agrees: harmless
  s.advance(ExtendResult{"a", {5}});        // late result: ignored
  EXPECT_EQ(s.request_stats("a").output_tokens, 1);
  EXPECT_THROW(s.advance(WriteBackDone{99}), std::invalid_argument);
}

TEST(Scheduler, ForwardResultMustMatchTheLatestForward) {
  Scheduler s(small_config());
  s.submit_requests({{"a", iota(3), 4, 0}});
  const ExecutionPlan p = s.next_execution_plan();
  EXPECT_THROW(s.advance(ForwardResult{p.forward->forward_id + 1, {1}, {}}), std::invalid_argument);
  EXPECT_THROW(s.advance(ForwardResult{p.forward->forward_id, {1, 2}, {}}), std::invalid_argument);
  s.advance(ForwardResult{p.forward->forward_id, {1}, {}});
  EXPECT_THROW(s.advance(ForwardResult{p.forward->forward_id, {1}, {}}),
               std::invalid_argument);  // reported twice
}
