#include "sdk/agent/failure_history.h"

#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainguard {
namespace {

// Lower case, as ReadsAsAnError compares.
constexpr std::string_view kErrorWords[] = {"error",
                                            "failed",
                                            "cannot",
                                            "can't",
                                            "fatal",
                                            "exception",
                                            "abort",
                                            "panic",
                                            "no space left",
                                            "out of memory",
                                            "segmentation fault",
                                            "terminate called"};

constexpr std::string_view kRuntimeReasons[] = {"trainguard: rank ", "trainguard: watchdog: "};

}  // namespace

std::string Death::Describe() const {
  std::string text = absl::StrCat(who, " ", how);
  if (!cause.empty()) absl::StrAppend(&text, ": ", cause);
  return text;
}

bool CauseLine::ReadsAsAnError(std::string_view line) {
  const absl::string_view view(line.data(), line.size());
  for (std::string_view prefix : kRuntimeReasons) {
    if (absl::StartsWith(view, absl::string_view(prefix.data(), prefix.size()))) return true;
  }
  const std::string lower = absl::AsciiStrToLower(view);
  for (std::string_view word : kErrorWords) {
    if (absl::StrContains(lower, absl::string_view(word.data(), word.size()))) return true;
  }
  return false;
}

void CauseLine::Observe(std::string_view line) {
  const absl::string_view trimmed =
      absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size()));
  if (!trimmed.empty() && ReadsAsAnError(std::string_view(trimmed.data(), trimmed.size()))) {
    line_ = std::string(trimmed);
  }
}

void FailureHistory::Record(Death death) {
  ++deaths_;
  if (first_.has_value()) return;
  if (death.cause.size() > kMaxCauseBytes) {
    // An error names its context first and its root (the errno's text) last: both stay, the
    // middle goes. Neither cut falls inside a UTF-8 sequence.
    const auto continuation = [&](size_t i) {
      return (static_cast<unsigned char>(death.cause[i]) & 0xC0) == 0x80;
    };
    size_t head = kMaxCauseBytes / 2;
    while (head > 0 && continuation(head)) --head;
    size_t tail = death.cause.size() - kMaxCauseBytes / 2;
    while (tail < death.cause.size() && continuation(tail)) ++tail;
    death.cause = absl::StrCat(death.cause.substr(0, head), " ... ", death.cause.substr(tail));
  }
  first_ = std::move(death);
}

std::string FailureHistory::FinalMessage(std::string_view why) const {
  std::string message(why);
  if (!first_.has_value() || (deaths_ == 1 && first_->cause.empty())) return message;
  absl::StrAppend(&message, "; first failure: ", first_->Describe());
  return message;
}

}  // namespace trainguard
