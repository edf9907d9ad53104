#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "tokenspeed/request_fsm.h"

using namespace tokenspeed;
using namespace tokenspeed::fsm;

namespace {

// Real resource owners, so that the tests also see what each transition gives back.
struct Owners {
  KvEventLog events{false, 4};
  KvCacheManager kv{4, 8, 0, true, &events};
  BlockTable table{4, 8};
  ReqPoolAllocator pool{4, "slots"};
  ResourceOwners owners{&kv, &table, &pool};

  ForwardResources resources() {
    const int32_t slot = pool.allocate_one();
    table.add_prefill_row(slot);
    ForwardResources r(&owners, slot, kRootNode);
    std::vector<int32_t> pages;
    kv.allocate_device(1, pages);
    r.push_page(pages[0]);
    return r;
  }
};

// The states of the diagram, with Decoding split by its in-flight flag.
const std::vector<std::string> kStates = {
    "Waiting",    "Prefilling", "PrefillDone", "Decoding", "Decoding(in flight)",
    "Retracting", "Retracted",  "Finished"};

State make_state(const std::string& name, Owners& o) {
  if (name == "Waiting") return Waiting{};
  if (name == "Prefilling") return Prefilling{o.resources()};
  if (name == "PrefillDone") return PrefillDone{o.resources()};
  if (name == "Decoding") return Decoding{o.resources(), false};
  if (name == "Decoding(in flight)") return Decoding{o.resources(), true};
  if (name == "Retracting") return Retracting{7};
  if (name == "Retracted") return Retracted{};
  return Finished{"stop"};
}

const std::vector<std::string> kEvents = {
    "Admit",   "ScheduleChunk",       "ScheduleChunk(last)", "ScheduleDecode", "TokensSampled",
    "Retract", "Retract(write back)", "WriteBackDone",       "Finish",         "Abort"};

Event make_event(const std::string& name, Owners& o) {
  if (name == "Admit") return Admit{o.resources()};
  if (name == "ScheduleChunk") return ScheduleChunk{false};
  if (name == "ScheduleChunk(last)") return ScheduleChunk{true};
  if (name == "ScheduleDecode") return ScheduleDecode{};
  if (name == "TokensSampled") return TokensSampled{};
  if (name == "Retract") return Retract{std::nullopt};
  if (name == "Retract(write back)") return Retract{3};
  if (name == "WriteBackDone") return WriteBackDone{};
  if (name == "Finish") return Finish{"length"};
  return Abort{};
}

// Every edge of the diagram: (state, event) -> next state. Anything else must throw.
const std::map<std::pair<std::string, std::string>, std::string> kEdges = {
    {{"Waiting", "Admit"}, "Prefilling"},
    {{"Retracted", "Admit"}, "Prefilling"},
    {{"Prefilling", "ScheduleChunk"}, "Prefilling"},
    {{"Prefilling", "ScheduleChunk(last)"}, "PrefillDone"},
    {{"PrefillDone", "TokensSampled"}, "Decoding"},
    {{"Decoding", "ScheduleDecode"}, "Decoding(in flight)"},
    {{"Decoding(in flight)", "TokensSampled"}, "Decoding"},
    {{"Prefilling", "Retract"}, "Retracted"},
    {{"Prefilling", "Retract(write back)"}, "Retracting"},
    {{"Decoding", "Retract"}, "Retracted"},
    {{"Decoding", "Retract(write back)"}, "Retracting"},
    {{"Retracting", "WriteBackDone"}, "Retracted"},
};

std::string expected_next(const std::string& state, const std::string& event) {
  if (const auto it = kEdges.find({state, event}); it != kEdges.end()) return it->second;
  if (event == "Finish" || event == "Abort") return "Finished";
  return "";
}

}  // namespace

TEST(RequestFsm, EveryStateEventPairFollowsTheDiagram) {
  int valid = 0, invalid = 0;
  for (const std::string& s : kStates) {
    for (const std::string& e : kEvents) {
      Owners o;
      State state = make_state(s, o);
      const std::string next = expected_next(s, e);
      SCOPED_TRACE(s + " + " + e);
      if (next.empty()) {
        ++invalid;
        try {
          apply(state, make_event(e, o), "req-1");
          ADD_FAILURE() << "no exception";
        } catch (const InvalidTransition& ex) {
          const std::string event_name = e.substr(0, e.find('('));
          EXPECT_EQ(ex.event(), event_name);
          EXPECT_EQ(ex.state(), s);
          const std::string what = ex.what();
          EXPECT_NE(what.find("req-1"), std::string::npos) << what;
          EXPECT_NE(what.find(event_name), std::string::npos) << what;
          EXPECT_NE(what.find(s), std::string::npos) << what;
        }
        EXPECT_EQ(state_name(state), s);  // an invalid event leaves the state alone
      } else {
        ++valid;
        apply(state, make_event(e, o), "req-1");
        EXPECT_EQ(state_name(state), next);
      }
      // Whatever happened, nothing leaks: only running states hold a slot and pages.
      const int32_t held = is_running(state) ? 1 : 0;
      EXPECT_EQ(o.pool.num_used(), held);
      EXPECT_EQ(o.kv.device().num_used(), held);
    }
  }
  EXPECT_EQ(valid, 12 + 2 * 8);  // the diagram's edges, plus Finish and Abort from all 8
  EXPECT_EQ(invalid, 8 * 10 - valid);
}

TEST(RequestFsm, FinishedIsAbsorbingAndKeepsTheFirstReason) {
  Owners o;
  State s = Decoding{o.resources(), false};
  apply(s, Finish{"stop"}, "r");
  apply(s, Finish{"length"}, "r");
  apply(s, Abort{}, "r");
  EXPECT_EQ(std::get<Finished>(s).reason, "stop");
}

TEST(RequestFsm, ResourcesMoveAlongTheRunningStates) {
  Owners o;
  State s = Waiting{};
  apply(s, Admit{o.resources()}, "r");
  apply(s, ScheduleChunk{false}, "r");
  apply(s, ScheduleChunk{true}, "r");
  apply(s, TokensSampled{}, "r");
  apply(s, ScheduleDecode{}, "r");
  EXPECT_EQ(o.pool.num_used(), 1);
  EXPECT_EQ(resources_of(s)->pages.size(), 1u);
  apply(s, TokensSampled{}, "r");
  apply(s, Retract{std::nullopt}, "r");
  EXPECT_EQ(o.pool.num_used(), 0);
  EXPECT_EQ(o.kv.device().num_used(), 0);
  EXPECT_EQ(o.table.row_of(0), -1);
}
