// How long each agent's fixed prompt prefix is (KVFlow §3.3), so the KV cache
// can give the agent's steps-to-execution to the last node of that prefix and
// treat everything after it as a dynamic suffix (evicted first).
//
// An agent's prompt = fixed part (role, instructions, few-shot examples; the
// same on every call) + dynamic part (this task's input). Per request:
//
//   1. Explicit: the request's fixed_prefix_tokens, clamped to the prompt length.
//   2. Detected: otherwise, the longest prefix that this prompt shares with each
//      of the agent's previous (num_prompts_compared - 1) prompts, i.e. the
//      longest common prefix of the agent's last num_prompts_compared prompts,
//      this one included. It is what those requests would all have hit in the
//      prefix cache, at token granularity (the cache rounds to its blocks).
//   3. First prompt: the agent's first prompt, with nothing explicit, counts as
//      fixed whole (provisionally), so the agent's prefix is prefetched and
//      kept before its second call, when the next rule corrects it (the few
//      blocks of the first call's own input go along once). Without this the
//      second call could not be prefetched: its fixed part is learned only
//      when it arrives (bench/README.md, KVFlow's "prefetch gap").
//
//   prompt 1:  [S S S S S S | a a a]
//   prompt 2:  [S S S S S S | b b]        detected 6 (lcp with prompt 1)
//   prompt 3:  [S S S S S S | b b c]      detected 6 (lcp of 1, 2, 3; 2 and 3 share 8)
//   ...                                   an outlier that shares less lowers the value
//                                         until it leaves the window
//
// Every prompt, explicit or not, enters the agent's history. Keys are
// (workflow, agent): names are scoped per workflow. History is bounded: at
// most max_prefix_tokens tokens kept per agent (longer common prefixes are
// reported as max_prefix_tokens) and max_tracked_agents agents (the least
// recently observed is forgotten first).
//
// Thread: not synchronized; one thread (the engine thread) owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

struct FixedPrefixTrackerConfig {
  int32_t num_prompts_compared = 4;     // >= 2: window of prompts whose common prefix is "fixed"
  int32_t max_tracked_agents = 4096;    // >= 1
  int32_t max_prefix_tokens = 1 << 16;  // >= 1: tokens of the latest prompt kept per agent
};

enum class FixedPrefixSource : uint8_t {
  kNone,         // no request observed (FixedPrefix's default): num_tokens is 0
  kExplicit,     // the request's fixed_prefix_tokens
  kDetected,     // the common prefix of the agent's recent prompts
  kFirstPrompt,  // the agent's first prompt, whole (rule 3)
};

struct FixedPrefix {
  int32_t num_tokens = 0;  // the prompt's first num_tokens tokens are the agent's fixed part
  FixedPrefixSource source = FixedPrefixSource::kNone;

  bool operator==(const FixedPrefix&) const = default;
};

class FixedPrefixTracker {
 public:
  // Throws Error(kInvalidArgument) when a bound above is broken.
  explicit FixedPrefixTracker(FixedPrefixTrackerConfig config = {});

  // Records a request of (workflow, agent) with `prompt` and returns its fixed
  // prefix under the rules above. `explicit_tokens` (>= 0) is the request's
  // fixed_prefix_tokens; a negative one throws Error(kInvalidArgument).
  FixedPrefix observe(std::string_view workflow, std::string_view agent, std::span<const int32_t> prompt,
                      std::optional<int32_t> explicit_tokens = std::nullopt);

  // The fixed prefix of the agent's latest request and its tokens (e.g. to
  // prefetch the prefix of an agent that runs next), without recording
  // anything; nullopt when the agent was never observed (or forgotten). The
  // span is valid until the next observe() or forget_workflow().
  struct Latest {
    FixedPrefix prefix;
    std::span<const int32_t> tokens;  // prefix.num_tokens tokens (fewer only past max_prefix_tokens)
  };
  std::optional<Latest> latest(std::string_view workflow, std::string_view agent) const;

  // Forgets every agent of `workflow` (it ended or expired).
  void forget_workflow(std::string_view workflow);
  // Forgets every workflow for which `should_forget(workflow)` holds, e.g. those
  // missing from a new WorkflowSnapshot. Returns how many.
  int32_t forget_workflows_if(const std::function<bool(std::string_view workflow)>& should_forget);
  int32_t num_tracked_agents() const { return static_cast<int32_t>(lru_.size()); }

 private:
  using LruList = std::list<std::pair<std::string, std::string>>;  // (workflow, agent), least recent first
  struct AgentHistory {
    std::vector<int32_t> latest_prompt;  // first max_prefix_tokens tokens of the latest prompt
    std::deque<int32_t> common_lengths;  // lcp of consecutive prompts, newest last
    FixedPrefix latest_prefix;
    LruList::iterator lru_position;
  };
  using AgentMap = std::map<std::string, AgentHistory, std::less<>>;

  void forget_least_recent();

  FixedPrefixTrackerConfig config_;
  std::map<std::string, AgentMap, std::less<>> workflows_;
  LruList lru_;
};

}  // namespace loom
