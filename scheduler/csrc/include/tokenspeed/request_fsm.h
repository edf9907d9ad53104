#pragma once
// The request state machine: states own resources, events move between states.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "tokenspeed/forward_resources.h"

namespace tokenspeed::fsm {

// --- states ---------------------------------------------------------------------------------
// Only the running states hold ForwardResources; every other state holds nothing the scheduler
// could leak.

struct Waiting {};   // submitted, never run
struct Prefilling {  // admitted; prompt chunks being computed
  ForwardResources resources;
};
struct PrefillDone {  // last chunk scheduled; waiting for the first sampled token
  ForwardResources resources;
};
struct Decoding {  // generating; in_flight while a scheduled step awaits its tokens
  ForwardResources resources;
  bool in_flight = false;
};
struct Retracting {  // preempted; its pages are being written back to the host
  uint64_t write_back_op = 0;
};
struct Retracted {};  // preempted; queued to resume by prefix match (+ load-back) and recompute
struct Finished {
  std::string reason;
};

using State =
    std::variant<Waiting, Prefilling, PrefillDone, Decoding, Retracting, Retracted, Finished>;

namespace detail {
template <class T, class... Ts>
constexpr size_t index_in(const std::variant<Ts...>*) {
  constexpr bool same[] = {std::is_same_v<T, Ts>...};
  for (size_t i = 0; i < sizeof...(Ts); ++i) {
    if (same[i]) return i;
  }
  return sizeof...(Ts);
}
}  // namespace detail

// Position of state type T in State, for per-state counters.
template <class T>
inline constexpr size_t kStateIndex = detail::index_in<T>(static_cast<const State*>(nullptr));

// --- events ---------------------------------------------------------------------------------

struct Admit {  // Waiting | Retracted -> Prefilling, with what the request will run with
  ForwardResources resources;
};
struct ScheduleChunk {  // Prefilling -> Prefilling, or -> PrefillDone for the last chunk
  bool last = false;
};
struct ScheduleDecode {};  // Decoding (ready) -> Decoding (in flight)
struct TokensSampled {};   // PrefillDone -> Decoding; Decoding (in flight) -> Decoding (ready)
struct Retract {           // Prefilling | Decoding (ready) -> Retracting, or -> Retracted
  std::optional<uint64_t> write_back_op;
};
struct WriteBackDone {};  // Retracting -> Retracted
struct Finish {           // any live state -> Finished; harmless on Finished
  std::string reason;
};
struct Abort {};  // any live state -> Finished("abort"); harmless on Finished

using Event = std::variant<Admit, ScheduleChunk, ScheduleDecode, TokensSampled, Retract,
                           WriteBackDone, Finish, Abort>;

// Thrown for an event the current state does not accept; names both.
class InvalidTransition : public std::logic_error {
 public:
  InvalidTransition(std::string_view request_id, std::string_view event, std::string_view state);
  const std::string& event() const { return event_; }
  const std::string& state() const { return state_; }

 private:
  std::string event_;
  std::string state_;
};

const char* state_name(const State& state);
const char* event_name(const Event& event);

namespace detail {

// Thrown by an edge that does not exist; apply() turns it into InvalidTransition.
struct NoEdge {};

using Next = std::optional<State>;  // nullopt: stay in the (possibly updated) current state

// Each non-template overload is one edge of the state diagram. The templates make Finish and
// Abort valid from every state and everything else invalid.
struct Edges {
  Next operator()(Waiting&, Admit& e) const { return Prefilling{std::move(e.resources)}; }
  Next operator()(Retracted&, Admit& e) const { return Prefilling{std::move(e.resources)}; }

  Next operator()(Prefilling& s, ScheduleChunk& e) const {
    if (e.last) return PrefillDone{std::move(s.resources)};
    return std::nullopt;
  }
  Next operator()(PrefillDone& s, TokensSampled&) const {
    return Decoding{std::move(s.resources), false};
  }
  Next operator()(Decoding& s, ScheduleDecode&) const {
    if (s.in_flight) throw NoEdge{};
    s.in_flight = true;
    return std::nullopt;
  }
  Next operator()(Decoding& s, TokensSampled&) const {
    if (!s.in_flight) throw NoEdge{};
    s.in_flight = false;
    return std::nullopt;
  }

  Next operator()(Prefilling&, Retract& e) const { return retract(e); }
  Next operator()(Decoding& s, Retract& e) const {
    if (s.in_flight) throw NoEdge{};
    return retract(e);
  }
  Next operator()(Retracting&, WriteBackDone&) const { return Retracted{}; }

  template <class S>
  Next operator()(S&, Finish& e) const {
    return Finished{e.reason};
  }
  template <class S>
  Next operator()(S&, Abort&) const {
    return Finished{"abort"};
  }
  Next operator()(Finished&, Finish&) const { return std::nullopt; }
  Next operator()(Finished&, Abort&) const { return std::nullopt; }

  template <class S, class E>
  Next operator()(S&, E&) const {
    throw NoEdge{};
  }

 private:
  static Next retract(const Retract& e) {
    if (e.write_back_op) return Retracting{*e.write_back_op};
    return Retracted{};
  }
};

}  // namespace detail

// The name of an event type, for error messages.
template <class E>
constexpr const char* event_name_of() {
  if constexpr (std::is_same_v<E, Admit>) return "Admit";
  if constexpr (std::is_same_v<E, ScheduleChunk>) return "ScheduleChunk";
  if constexpr (std::is_same_v<E, ScheduleDecode>) return "ScheduleDecode";
  if constexpr (std::is_same_v<E, TokensSampled>) return "TokensSampled";
  if constexpr (std::is_same_v<E, Retract>) return "Retract";
  if constexpr (std::is_same_v<E, WriteBackDone>) return "WriteBackDone";
  if constexpr (std::is_same_v<E, Finish>) return "Finish";
  if constexpr (std::is_same_v<E, Abort>) return "Abort";
}

// Applies `event` to `state`: replaces it with the next state, or updates it in place when the
// state type does not change. Resources of a state that is left are released by its
// destruction. A template over the event type, so that the per-step decode edges compile to one
// switch on the state.
template <class E>
void apply(State& state, E event, std::string_view request_id) {
  detail::Next next;
  try {
    next = std::visit([&](auto& s) { return detail::Edges{}(s, event); }, state);
  } catch (const detail::NoEdge&) {
    throw InvalidTransition(request_id, event_name_of<E>(), state_name(state));
  }
  if (next) state = std::move(*next);
}

// The same for an event held in the Event variant.
void apply(State& state, Event event, std::string_view request_id);

inline bool is_running(const State& s) {
  return std::holds_alternative<Prefilling>(s) || std::holds_alternative<PrefillDone>(s) ||
         std::holds_alternative<Decoding>(s);
}
// The resources of a running request, or null.
inline ForwardResources* resources_of(State& s) {
  if (auto* p = std::get_if<Decoding>(&s)) return &p->resources;
  if (auto* p = std::get_if<Prefilling>(&s)) return &p->resources;
  if (auto* p = std::get_if<PrefillDone>(&s)) return &p->resources;
  return nullptr;
}
inline const ForwardResources* resources_of(const State& s) {
  return resources_of(const_cast<State&>(s));
}

}  // namespace tokenspeed::fsm
