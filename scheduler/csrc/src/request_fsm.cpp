#include "tokenspeed/request_fsm.h"

#include <type_traits>

namespace tokenspeed::fsm {
namespace {

template <class T>
constexpr const char* state_name_of() {
  if constexpr (std::is_same_v<T, Waiting>) return "Waiting";
  if constexpr (std::is_same_v<T, Prefilling>) return "Prefilling";
  if constexpr (std::is_same_v<T, PrefillDone>) return "PrefillDone";
  if constexpr (std::is_same_v<T, Decoding>) return "Decoding";
  if constexpr (std::is_same_v<T, Retracting>) return "Retracting";
  if constexpr (std::is_same_v<T, Retracted>) return "Retracted";
  if constexpr (std::is_same_v<T, Finished>) return "Finished";
}

}  // namespace

InvalidTransition::InvalidTransition(std::string_view request_id, std::string_view event,
                                     std::string_view state)
    : std::logic_error("request '" + std::string(request_id) + "': event " + std::string(event) +
                       " is not valid in state " + std::string(state)),
      event_(event),
      state_(state) {}

const char* state_name(const State& state) {
  return std::visit(
      [](const auto& s) -> const char* {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, Decoding>) {
          return s.in_flight ? "Decoding(in flight)" : "Decoding";
        } else {
          return state_name_of<S>();
        }
      },
      state);
}

const char* event_name(const Event& event) {
  return std::visit([](const auto& e) { return event_name_of<std::decay_t<decltype(e)>>(); },
                    event);
}

void apply(State& state, Event event, std::string_view request_id) {
  std::visit([&](auto& e) { apply(state, std::move(e), request_id); }, event);
}

}  // namespace tokenspeed::fsm
